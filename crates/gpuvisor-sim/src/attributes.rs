//! Device attributes (`cuDeviceGetAttribute`) as an H100 SXM5 80GB reports them, by
//! `CUdevice_attribute` number (cuda.h of CUDA 13). Libraries size kernels, shared memory and
//! launch configurations from these: an attribute answered 0 where the card has a value makes
//! them fail in ways far from the cause, so every attribute of cuda.h has its H100 value.

/// The value of `attribute` for the device with physical index `physical_index`, or None for a
/// number cuda.h does not define.
pub fn h100(attribute: i32, physical_index: u32) -> Option<i32> {
    let bus = crate::config::pci_bus(physical_index) as i32;
    Some(match attribute {
        1 => 1024,                                     // max threads per block
        2 => 1024,                                     // max block dim x
        3 => 1024,                                     // max block dim y
        4 => 64,                                       // max block dim z
        5 => i32::MAX,                                 // max grid dim x
        6 | 7 => 65535,                                // max grid dim y, z
        8 => 49152,                                    // shared memory per block
        9 => 65536,                                    // total constant memory
        10 => 32,                                      // warp size
        11 => i32::MAX,                                // max pitch
        12 => 65536,                                   // registers per block
        13 => 1_980_000,                               // clock rate (kHz)
        14 => 512,                                     // texture alignment
        15 => 1,                                       // copy and kernel overlap
        16 => 132,                                     // multiprocessors
        17 => 0,                                       // kernel execution timeout
        18 => 0,                                       // integrated
        19 => 1,                                       // can map host memory
        20 => 0,                                       // compute mode: default
        21 => 131_072,                                 // max texture 1D width
        22 => 131_072,                                 // max texture 2D width
        23 => 65536,                                   // max texture 2D height
        24..=26 => 16384,                              // max texture 3D width, height, depth
        27 | 28 => 32768,                              // max texture 2D layered width, height
        29 => 2048,                                    // max texture 2D layers
        30 => 512,                                     // surface alignment
        31 => 1,                                       // concurrent kernels
        32 => 1,                                       // ECC enabled
        33 => bus,                                     // PCI bus id
        34 => 0,                                       // PCI device id
        35 => 0,                                       // TCC driver
        36 => 2_619_000,                               // memory clock rate (kHz)
        37 => 5120,                                    // memory bus width (bits)
        38 => 52_428_800,                              // L2 cache size
        39 => 2048,                                    // max threads per multiprocessor
        40 => 3,                                       // async engines
        41 => 1,                                       // unified addressing
        42 => 32768,                                   // max texture 1D layered width
        43 => 2048,                                    // max texture 1D layers
        44 => 1,                                       // can texture 2D gather (deprecated)
        45 | 46 => 32768,                              // max texture 2D gather width, height
        47 | 48 => 8192,                               // max texture 3D width, height (alternate)
        49 => 32768,                                   // max texture 3D depth (alternate)
        50 => 0,                                       // PCI domain
        51 => 32,                                      // texture pitch alignment
        52 | 53 => 32768,                              // max texture cubemap width, layered width
        54 => 2046,                                    // max texture cubemap layers
        55 => 32768,                                   // max surface 1D width
        56 => 131_072,                                 // max surface 2D width
        57 => 65536,                                   // max surface 2D height
        58..=60 => 16384,                              // max surface 3D width, height, depth
        61 => 32768,                                   // max surface 1D layered width
        62 => 2048,                                    // max surface 1D layers
        63 | 64 => 32768,                              // max surface 2D layered width, height
        65 => 2048,                                    // max surface 2D layers
        66 | 67 => 32768,                              // max surface cubemap width, layered width
        68 => 2046,                                    // max surface cubemap layers
        69 => 268_435_456,                             // max texture 1D linear width (deprecated)
        70 => 131_072,                                 // max texture 2D linear width
        71 => 65000,                                   // max texture 2D linear height
        72 => 2_097_120,                               // max texture 2D linear pitch
        73 | 74 => 32768,                              // max texture 2D mipmapped width, height
        75 => 9,                                       // compute capability major
        76 => 0,                                       // compute capability minor
        77 => 32768,                                   // max texture 1D mipmapped width
        78 => 1,                                       // stream priorities supported
        79 | 80 => 1,                                  // global and local L1 cache supported
        81 => 233_472,                                 // shared memory per multiprocessor
        82 => 65536,                                   // registers per multiprocessor
        83 => 1,                                       // managed memory
        84 => 0,                                       // multi-GPU board
        85 => bus - 1,                                 // multi-GPU board group id
        86 => 0,                                       // host native atomics
        87 => 2,            // single to double precision performance ratio
        88 => 0,            // pageable memory access
        89 => 1,            // concurrent managed access
        90 => 1,            // compute preemption
        91 => 1,            // can use host pointer for registered memory
        92..=94 => 1,       // stream memory operations (v1, 64-bit, wait value NOR)
        95 | 96 => 1,       // cooperative launch, multi-device cooperative launch
        97 => 232_448,      // max shared memory per block (opt-in)
        98 => 0,            // can flush remote writes
        99 => 1,            // host register supported
        100 | 101 => 0,     // pageable access uses host page tables; direct managed access
        102 => 1,           // virtual memory management
        103 => 1,           // POSIX file descriptor handles
        104 | 105 => 0,     // Win32 handles
        106 => 32,          // max blocks per multiprocessor
        107 => 1,           // generic compression
        108 => 34_603_008,  // max persisting L2 cache size
        109 => 134_213_632, // max access policy window size
        110 => 1,           // GPUDirect RDMA with CUDA VMM
        111 => 1024,        // reserved shared memory per block
        112 | 113 => 1,     // sparse CUDA arrays; read-only host register
        114 => 1,           // timeline semaphore interop
        115 => 1,           // memory pools
        116 => 1,           // GPUDirect RDMA
        117 => 1,           // GPUDirect RDMA flush writes options (host)
        118 => 100,         // GPUDirect RDMA writes ordering: owner
        119 => 1,           // mempool handle types: POSIX file descriptor
        120 => 1,           // cluster launch
        121 => 1,           // deferred mapping CUDA arrays
        122 | 123 => 1,     // 64-bit stream memory operations; wait value NOR
        124 => 1,           // DMA-BUF
        125 => 1,           // IPC events
        126 => 4,           // memory sync domains
        127 => 1,           // tensor map access
        128 => 0,           // fabric handles
        129 => 1,           // unified function pointers
        130 => 0,           // NUMA config: none
        131 => -1,          // NUMA id
        132 => 0,           // multicast (NVLink SHARP): not on a PCIe machine
        133 => 0,           // MPS enabled
        134 => -1,          // host NUMA id
        135..=138 => 0,     // D3D12/Vulkan CIG, memory decompression
        139 => crate::config::PCI_DEVICE_ID as i32, // PCI device id (H100 SXM5)
        140 => crate::config::PCI_SUBSYSTEM_ID as i32, // PCI subsystem id
        141..=148 => 0,     // host NUMA/VMM/pool features, partial host atomics, reductions
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::h100;

    #[test]
    fn every_attribute_of_cuda_h_has_a_value() {
        for attribute in 1..=148 {
            assert!(h100(attribute, 0).is_some(), "attribute {attribute}");
        }
        assert_eq!(h100(0, 0), None);
        assert_eq!(h100(149, 0), None);
        assert_eq!(h100(33, 2), Some(3), "PCI bus follows the physical index");
    }
}
