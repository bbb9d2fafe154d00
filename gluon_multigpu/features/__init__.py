"""The exercises, each a plug-in of ``train``: uneven splits, float16, synchronised BatchNorm,
the parameter server."""
