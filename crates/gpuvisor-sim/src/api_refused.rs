//! Entry points of features an H100 on a PCIe machine does not offer here, answered as the
//! driver answers for a device without them: CUDA_ERROR_NOT_SUPPORTED when called.
//!
//! They differ from the generated stubs in one way: cuGetProcAddress finds them. PyTorch's
//! c10 resolves green contexts, device resources and multicast objects at start-up and refuses
//! to start when a lookup fails, but calls them only when a program asks for the feature
//! (device attribute 132, multicast, is 0). A call is recorded like any unserved request.

/// Exported entry points that record the call and answer CUDA_ERROR_NOT_SUPPORTED.
macro_rules! refused {
    ($($name:ident();)*) => {$(
        #[doc = concat!(stringify!($name), ": not offered by the simulated device.")]
        #[no_mangle]
        pub extern "C" fn $name() -> i32 {
            crate::unserved::entry(stringify!($name))
        }
    )*};
}

refused! {
    cuCtxFromGreenCtx();
    cuCtxGetDevResource();
    cuDevResourceGenerateDesc();
    cuDevSmResourceSplit();
    cuDevSmResourceSplitByCount();
    cuDeviceGetDevResource();
    cuGreenCtxCreate();
    cuGreenCtxDestroy();
    cuGreenCtxGetDevResource();
    cuGreenCtxGetId();
    cuGreenCtxRecordEvent();
    cuGreenCtxStreamCreate();
    cuGreenCtxWaitEvent();
    cuStreamGetDevResource();
    cuMulticastAddDevice();
    cuMulticastBindAddr();
    cuMulticastBindMem();
    cuMulticastCreate();
    cuMulticastGetGranularity();
    cuMulticastUnbind();
}
