"""Op lowerings by family; importing this package fills the table in ``_registry``."""
from . import core, creation, elementwise, indexing, linalg, nn, reduction, shape  # noqa: F401
