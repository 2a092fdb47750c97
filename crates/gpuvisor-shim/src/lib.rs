//! The gpuvisor CUDA-driver shim (being written).
