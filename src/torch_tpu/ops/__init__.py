"""Op lowerings by family; importing this package fills the table in ``registry``; ``dispatch`` installs it.

``optim`` comes after the families whose lowerings its ``_foreach_*`` ops apply per tensor.
"""

from . import (  # noqa: F401
    complex,
    core,
    creation,
    elementwise,
    fft,
    indexing,
    linalg,
    losses,
    nn,
    optim,  # noqa: F401,E402
    pooling,
    random,
    reduction,
    rnn,
    sampling,
    shape,
    sparse,
    special,
)
