"""One module per kernel adapter; each calls longca.kernels.registry.register on import."""
