//! The gpuvisor GPU simulator: a stand-in `libcuda.so.1` (being written).
