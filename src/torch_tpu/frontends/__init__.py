"""Ways into the device other than eager ops: ``torch.compile(backend="tpu")`` (``compile``) and
``torch.export`` to StableHLO (``export``). Both trace through the eager lowerings."""
