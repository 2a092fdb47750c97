//! Struct layouts against nvml.h, and the exported calls on one simulated machine.

use std::ffi::{c_char, CStr};
use std::mem::size_of;
use std::ptr::null_mut;

use super::api_device::*;
use super::api_memory::*;
use super::api_system::*;
use super::machine::Machine;
use super::*;
use crate::physical::Physical;

#[test]
fn structs_have_the_sizes_and_version_words_of_nvml_h() {
    assert_eq!(size_of::<Memory>(), 24);
    assert_eq!(size_of::<MemoryV2>(), 40);
    assert_eq!(struct_version::<MemoryV2>(2), 0x0200_0028);
    assert_eq!(size_of::<Utilization>(), 8);
    assert_eq!(size_of::<ProcessInfoV1>(), 16);
    assert_eq!(size_of::<ProcessInfo>(), 24);
    assert_eq!(size_of::<ProcessDetailV1>(), 32);
    assert_eq!(struct_version::<ProcessDetailListV1>(1), 0x0100_0018);
    assert_eq!(size_of::<PciInfo>(), 68);
    assert_eq!(size_of::<PciInfoV1>(), 52);
    assert_eq!(struct_version::<PciInfoExtV1>(1), 0x0100_0040);
    assert_eq!(struct_version::<TemperatureV1>(1), 0x0100_000C);
    assert_eq!(struct_version::<ConfComputeSettingsV1>(1), 0x0100_0014);
    assert_eq!(size_of::<FieldValue>(), 40);
    assert_eq!(size_of::<ConfComputeSystemState>(), 12);
}

fn text(buffer: &[u8]) -> &str {
    CStr::from_bytes_until_nul(buffer)
        .unwrap()
        .to_str()
        .unwrap()
}

/// The whole API on one machine: the machine is process-wide, so one test owns it.
#[test]
fn exported_calls_answer_for_every_physical_device() {
    let state = std::env::temp_dir().join(format!("gpuvisor-nvml-test-{}", std::process::id()));
    let _ = std::fs::remove_file(&state);
    let mut devices = crate::config::parse_devices("3x16GiB").unwrap();
    devices[2].foreign_bytes = 1 << 30;
    install(Machine {
        devices,
        cuda_version: 12080,
        state_path: Some(state.to_str().unwrap().to_string()),
    });
    let mut count = 0u32;
    // SAFETY (whole test): every pointer passed is to a live local of the right type and size.
    unsafe {
        assert_eq!(nvmlDeviceGetCount_v2(&mut count), ret::UNINITIALIZED);
        assert_eq!(nvmlInit_v2(), ret::SUCCESS);
        assert_eq!(nvmlInitWithFlags(0), ret::SUCCESS);
        assert_eq!(nvmlShutdown(), ret::SUCCESS);
        assert_eq!(nvmlDeviceGetCount_v2(&mut count), ret::SUCCESS);
        assert_eq!(count, 3);

        let mut buffer = [0u8; 96];
        let raw = buffer.as_mut_ptr().cast::<c_char>();
        assert_eq!(nvmlSystemGetDriverVersion(raw, 80), ret::SUCCESS);
        assert_eq!(text(&buffer), "570.124.06");
        assert_eq!(nvmlSystemGetDriverVersion(raw, 5), ret::INSUFFICIENT_SIZE);
        let mut cuda = 0;
        assert_eq!(nvmlSystemGetCudaDriverVersion_v2(&mut cuda), ret::SUCCESS);
        assert_eq!(cuda, 12080);

        let mut handle = null_mut();
        assert_eq!(
            nvmlDeviceGetHandleByIndex_v2(3, &mut handle),
            ret::INVALID_ARGUMENT
        );
        assert_eq!(
            nvmlDeviceGetHandleByPciBusId_v2(c"0000:03:00.0".as_ptr(), &mut handle),
            ret::SUCCESS
        );
        assert_eq!(handle, handle_of(2));
        assert_eq!(
            nvmlDeviceGetHandleByPciBusId_v2(c"00000000:09:00.0".as_ptr(), &mut handle),
            ret::NOT_FOUND
        );
        assert_eq!(
            nvmlDeviceGetHandleByUUID(
                c"GPU-5111a7ed-0000-4000-8000-000000000001".as_ptr(),
                &mut handle
            ),
            ret::SUCCESS
        );
        assert_eq!(handle, handle_of(1));
        let mut index = 9;
        assert_eq!(nvmlDeviceGetIndex(handle, &mut index), ret::SUCCESS);
        assert_eq!(index, 1);
        assert_eq!(
            nvmlDeviceGetIndex(handle_of(5), &mut index),
            ret::INVALID_ARGUMENT
        );
        assert_eq!(
            nvmlDeviceGetIndex(handle_of(0).cast::<u8>().add(1).cast(), &mut index),
            ret::INVALID_ARGUMENT
        );
        assert_eq!(nvmlDeviceGetUUID(handle, raw, 80), ret::SUCCESS);
        assert_eq!(text(&buffer), "GPU-5111a7ed-0000-4000-8000-000000000001");

        let mut pci: PciInfo = std::mem::zeroed();
        assert_eq!(nvmlDeviceGetPciInfo_v3(handle, &mut pci), ret::SUCCESS);
        let bytes = std::slice::from_raw_parts((&raw const pci).cast::<u8>(), 68);
        assert_eq!(text(&bytes[..16]), "0000:02:00.0");
        assert_eq!(text(&bytes[36..]), "00000000:02:00.0");
        assert_eq!(&bytes[20..24], &2u32.to_ne_bytes());
        assert_eq!(&bytes[28..32], &0x2330_10DEu32.to_ne_bytes());

        let mut status = 7;
        assert_eq!(
            nvmlDeviceGetP2PStatus(handle_of(0), handle_of(2), 0, &mut status),
            ret::SUCCESS
        );
        assert_eq!(status, 0);
        let mut active = 0;
        assert_eq!(
            nvmlDeviceGetNvLinkState(handle, 0, &mut active),
            ret::NOT_SUPPORTED
        );

        // Physical use as the card sees it: this process and another live one (pid 1) hold
        // memory through the state file; a dead one's slot does not count.
        let table = Physical::open(state.to_str());
        let own = table.claim(std::process::id()).unwrap();
        let other = table.claim(1).unwrap();
        let dead = table.claim(2_000_000_000).unwrap();
        assert!(table.reserve(own, 2, 300 << 20, u64::MAX));
        assert!(table.reserve(other, 2, 2 << 30, u64::MAX));
        assert!(table.reserve(dead, 2, 4 << 30, u64::MAX));
        let mut memory = MemoryV2 {
            version: struct_version::<MemoryV2>(2),
            ..std::mem::zeroed()
        };
        let third = handle_of(2);
        assert_eq!(nvmlDeviceGetMemoryInfo_v2(third, &mut memory), ret::SUCCESS);
        let used = (1 << 30) + (300 << 20) + (2 << 30);
        assert_eq!((memory.total, memory.used), (16 << 30, used));
        assert_eq!(memory.free, (16 << 30) - used);
        memory.version = 0x0100_0028;
        assert_eq!(
            nvmlDeviceGetMemoryInfo_v2(third, &mut memory),
            ret::ARGUMENT_VERSION_MISMATCH
        );
        let mut v1: Memory = std::mem::zeroed();
        assert_eq!(nvmlDeviceGetMemoryInfo(handle_of(0), &mut v1), ret::SUCCESS);
        assert_eq!((v1.total, v1.used, v1.free), (16 << 30, 0, 16 << 30));

        // The *infoCount protocol: ask, get the count, call again with room.
        let mut count = 0;
        assert_eq!(
            nvmlDeviceGetComputeRunningProcesses_v3(third, &mut count, null_mut()),
            ret::INSUFFICIENT_SIZE
        );
        assert_eq!(count, 2);
        let mut infos = [ProcessInfo::from((0, 0)); 4];
        count = 1;
        assert_eq!(
            nvmlDeviceGetComputeRunningProcesses_v3(third, &mut count, infos.as_mut_ptr()),
            ret::INSUFFICIENT_SIZE
        );
        assert_eq!(count, 2);
        count = 4;
        assert_eq!(
            nvmlDeviceGetComputeRunningProcesses_v3(third, &mut count, infos.as_mut_ptr()),
            ret::SUCCESS
        );
        assert_eq!(count, 2);
        assert_eq!(
            infos[..2],
            [
                ProcessInfo::from((std::process::id(), 300 << 20)),
                ProcessInfo::from((1, 2 << 30))
            ]
        );
        assert_eq!(infos[0].gpu_instance_id, u32::MAX);
        let mut old = [ProcessInfoV1::from((0, 0)); 2];
        count = 2;
        assert_eq!(
            nvmlDeviceGetComputeRunningProcesses(third, &mut count, old.as_mut_ptr()),
            ret::SUCCESS
        );
        assert_eq!(old[1], ProcessInfoV1::from((1, 2 << 30)));
        count = 0;
        assert_eq!(
            nvmlDeviceGetComputeRunningProcesses_v3(handle_of(0), &mut count, null_mut()),
            ret::SUCCESS
        );
        assert_eq!(count, 0);
        assert_eq!(
            nvmlDeviceGetGraphicsRunningProcesses_v3(third, &mut count, null_mut()),
            ret::SUCCESS
        );
        assert_eq!(count, 0);

        assert_eq!(nvmlShutdown(), ret::SUCCESS);
        assert_eq!(nvmlShutdown(), ret::UNINITIALIZED);
        assert_eq!(nvmlDeviceGetIndex(third, &mut index), ret::UNINITIALIZED);
        let message = CStr::from_ptr(nvmlErrorString(ret::INSUFFICIENT_SIZE));
        assert_eq!(message.to_str().unwrap(), "Insufficient Size");
    }
    std::fs::remove_file(&state).unwrap();
}
