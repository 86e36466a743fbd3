"""The CUDA backend: kernels scheduled by TVM's DLight, compiled by nvcc (:mod:`.nvcc`) into a fatbin that
is packed into the library at export (:mod:`.devpack`); :mod:`.pipeline` has the unfused GPU pipeline."""
