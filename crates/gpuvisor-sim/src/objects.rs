//! The driver objects that hold no device memory: modules and libraries, functions and
//! kernels, events, graphs and stream captures, and the runtime's context-local storage.
//!
//! Each is a handle (an opaque pointer to the caller) with a little bookkeeping, so that
//! lookups by name give the same handle twice, names and attributes read back, events report
//! what was recorded, and captures report their state. Kernels never run: a launch only counts
//! as a node in a capturing stream's graph.

use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::time::Instant;

use crate::driver::code;
use crate::forklock::ForkLock;
use crate::put;

/// A context-local storage destructor: `(context, key, value)`.
pub type StorageDestructor = unsafe extern "C" fn(*mut c_void, *mut c_void, *mut c_void);

/// A loaded module or library.
#[derive(Default)]
struct Module {
    /// Function (or kernel) handles by name.
    functions: HashMap<Vec<u8>, u64>,
    /// Globals by name: (address, size).
    globals: HashMap<Vec<u8>, (u64, usize)>,
}

/// A function or kernel.
struct Function {
    name: CString,
    module: u64,
    /// Attributes set by cuFuncSetAttribute / cuKernelSetAttribute.
    attributes: HashMap<i32, i32>,
}

/// An event.
#[derive(Clone, Copy)]
pub struct Event {
    /// When it was last recorded, and the host-function ticket it waits for.
    pub recorded: Option<(Instant, u64)>,
    /// CU_EVENT_DISABLE_TIMING was given.
    pub timing_disabled: bool,
}

/// A stream capture in progress.
#[derive(Clone, Copy)]
pub struct Capture {
    /// The capture's id.
    pub id: u64,
    /// The graph being built.
    pub graph: u64,
}

#[derive(Default)]
struct Objects {
    next: u64,
    modules: HashMap<u64, Module>,
    functions: HashMap<u64, Function>,
    storage: Vec<(u64, u64, usize, Option<StorageDestructor>)>,
    events: HashMap<u64, Event>,
    /// Graph -> node count.
    graphs: HashMap<u64, u64>,
    /// Executable graph -> its graph's node count.
    executables: HashMap<u64, u64>,
    captures: HashMap<u64, Capture>,
    next_global: u64,
}

static OBJECTS: ForkLock<Objects> = ForkLock::new();

/// Where fake addresses of module globals start (beside the allocation windows).
pub const GLOBALS_BASE: u64 = 0x6f00_0000_0000;
/// Where they end (a 1 TiB window: a million globals).
pub const GLOBALS_END: u64 = GLOBALS_BASE + (1 << 40);
/// The size reported for a module global: the simulator does not parse the binary, and a size
/// larger than the real one keeps callers' `copy <= size` checks true.
pub const GLOBAL_BYTES: usize = 1 << 20;

impl Objects {
    fn handle(&mut self, kind: u64) -> u64 {
        self.next += 1;
        kind << 32 | self.next << 4
    }
}

/// Handle kinds, in the high bits, to tell handles apart when debugging.
const MODULE: u64 = 0x5153;
const FUNCTION: u64 = 0x5154;
const EVENT: u64 = 0x5155;
const GRAPH: u64 = 0x5156;
const EXECUTABLE: u64 = 0x5157;
const LINK: u64 = 0x5158;

/// Loads a module (or library): nothing is parsed; writes its handle to `out`.
pub unsafe fn new_module_into(out: *mut u64) -> i32 {
    if out.is_null() {
        return code::INVALID_VALUE;
    }
    let handle = OBJECTS.with(|objects| {
        let handle = objects.handle(MODULE);
        objects.modules.insert(handle, Module::default());
        handle
    });
    put(out, handle);
    code::SUCCESS
}

/// Unloads a module or library.
pub fn unload_module(module: u64) -> i32 {
    OBJECTS.with(|objects| match objects.modules.remove(&module) {
        Some(removed) => {
            for function in removed.functions.values() {
                objects.functions.remove(function);
            }
            code::SUCCESS
        }
        None => code::INVALID_HANDLE,
    })
}

/// The function `name` of `module`, the same handle on every lookup.
pub fn function(module: u64, name: &[u8]) -> Result<u64, i32> {
    OBJECTS.with(|objects| {
        if let Some(&handle) = objects
            .modules
            .get(&module)
            .and_then(|loaded| loaded.functions.get(name))
        {
            return Ok(handle);
        }
        if !objects.modules.contains_key(&module) {
            return Err(code::INVALID_HANDLE);
        }
        let handle = objects.handle(FUNCTION);
        let Ok(text) = CString::new(name) else {
            return Err(code::INVALID_VALUE);
        };
        objects.functions.insert(
            handle,
            Function {
                name: text,
                module,
                attributes: HashMap::new(),
            },
        );
        if let Some(loaded) = objects.modules.get_mut(&module) {
            loaded.functions.insert(name.to_vec(), handle);
        }
        Ok(handle)
    })
}

/// The functions of `module` (as many as it has handed out).
pub fn functions_of(module: u64) -> Result<Vec<u64>, i32> {
    OBJECTS.with(|objects| {
        objects
            .modules
            .get(&module)
            .map(|loaded| loaded.functions.values().copied().collect())
            .ok_or(code::INVALID_HANDLE)
    })
}

/// A function's name (stable while the function lives) and module.
pub fn function_info(function: u64) -> Result<(*const std::ffi::c_char, u64), i32> {
    OBJECTS.with(|objects| {
        objects
            .functions
            .get(&function)
            .map(|known| (known.name.as_ptr(), known.module))
            .ok_or(code::INVALID_HANDLE)
    })
}

/// A copy of a function's name (for the stall rule, which outlives the lock).
pub fn function_name(function: u64) -> Option<Vec<u8>> {
    OBJECTS.with(|objects| {
        objects
            .functions
            .get(&function)
            .map(|known| known.name.to_bytes().to_vec())
    })
}

/// An attribute set on a function, if any.
pub fn function_attribute(function: u64, attribute: i32) -> Result<Option<i32>, i32> {
    OBJECTS.with(|objects| {
        objects
            .functions
            .get(&function)
            .map(|known| known.attributes.get(&attribute).copied())
            .ok_or(code::INVALID_HANDLE)
    })
}

/// Sets an attribute of a function.
pub fn set_function_attribute(function: u64, attribute: i32, value: i32) -> i32 {
    OBJECTS.with(|objects| match objects.functions.get_mut(&function) {
        Some(known) => {
            known.attributes.insert(attribute, value);
            code::SUCCESS
        }
        None => code::INVALID_HANDLE,
    })
}

/// The global `name` of `module`: a fake address, the same on every lookup.
pub fn global(module: u64, name: &[u8]) -> Result<(u64, usize), i32> {
    OBJECTS.with(|objects| {
        let next = objects.next_global;
        let Some(loaded) = objects.modules.get_mut(&module) else {
            return Err(code::INVALID_HANDLE);
        };
        if let Some(&found) = loaded.globals.get(name) {
            return Ok(found);
        }
        let found = (GLOBALS_BASE + next * GLOBAL_BYTES as u64, GLOBAL_BYTES);
        loaded.globals.insert(name.to_vec(), found);
        objects.next_global += 1;
        Ok(found)
    })
}

/// A linker state (cuLinkCreate).
pub fn new_link() -> u64 {
    OBJECTS.with(|objects| objects.handle(LINK))
}

// ---- context-local storage (the runtime's per-context values) ----

/// Stores `value` under (`context`, `key`), replacing what was there.
pub fn storage_put(
    context: u64,
    key: u64,
    value: *mut c_void,
    destructor: Option<StorageDestructor>,
) -> i32 {
    OBJECTS.with(|objects| {
        objects
            .storage
            .retain(|entry| (entry.0, entry.1) != (context, key));
        objects
            .storage
            .push((context, key, value as usize, destructor));
    });
    code::SUCCESS
}

/// Deletes the value under (`context`, `key`).
pub fn storage_delete(context: u64, key: u64) -> i32 {
    OBJECTS.with(|objects| {
        let before = objects.storage.len();
        objects
            .storage
            .retain(|entry| (entry.0, entry.1) != (context, key));
        if objects.storage.len() < before {
            code::SUCCESS
        } else {
            code::INVALID_HANDLE
        }
    })
}

/// The value under (`context`, `key`).
pub fn storage_get(context: u64, key: u64) -> Option<*mut c_void> {
    OBJECTS.with(|objects| {
        objects
            .storage
            .iter()
            .find(|entry| (entry.0, entry.1) == (context, key))
            .map(|entry| entry.2 as *mut c_void)
    })
}

/// Runs and forgets the destructors of `context`'s values (its primary context was reset).
pub fn storage_reset(context: u64) {
    let gone: Vec<_> = OBJECTS.with(|objects| {
        let (gone, kept) = objects
            .storage
            .drain(..)
            .partition(|entry| entry.0 == context);
        objects.storage = kept;
        gone
    });
    // Outside the lock: a destructor may call back into the storage.
    for (context, key, value, destructor) in gone {
        if let Some(destructor) = destructor {
            // SAFETY: the runtime registered this destructor for exactly these arguments.
            unsafe {
                destructor(
                    context as *mut c_void,
                    key as *mut c_void,
                    value as *mut c_void,
                )
            };
        }
    }
}

// ---- events ----

/// A new event.
pub fn new_event(timing_disabled: bool) -> u64 {
    OBJECTS.with(|objects| {
        let handle = objects.handle(EVENT);
        objects.events.insert(
            handle,
            Event {
                recorded: None,
                timing_disabled,
            },
        );
        handle
    })
}

/// Records `event` now, complete once host-function `ticket` has run.
pub fn record_event(event: u64, ticket: u64) -> i32 {
    OBJECTS.with(|objects| match objects.events.get_mut(&event) {
        Some(known) => {
            known.recorded = Some((Instant::now(), ticket));
            code::SUCCESS
        }
        None => code::INVALID_HANDLE,
    })
}

/// An event's state.
pub fn event(event: u64) -> Result<Event, i32> {
    OBJECTS.with(|objects| {
        objects
            .events
            .get(&event)
            .copied()
            .ok_or(code::INVALID_HANDLE)
    })
}

/// Destroys an event.
pub fn destroy_event(event: u64) -> i32 {
    OBJECTS.with(|objects| {
        if objects.events.remove(&event).is_some() {
            code::SUCCESS
        } else {
            code::INVALID_HANDLE
        }
    })
}

// ---- graphs and captures ----

/// A new, empty graph.
pub fn new_graph() -> u64 {
    OBJECTS.with(|objects| {
        let handle = objects.handle(GRAPH);
        objects.graphs.insert(handle, 0);
        handle
    })
}

/// Adds a node to `graph`; returns a node handle.
pub fn add_node(graph: u64) -> Result<u64, i32> {
    OBJECTS.with(|objects| {
        let nodes = objects.graphs.get_mut(&graph).ok_or(code::INVALID_HANDLE)?;
        *nodes += 1;
        Ok(graph + *nodes)
    })
}

/// The node count of a graph.
pub fn graph_nodes(graph: u64) -> Result<u64, i32> {
    OBJECTS.with(|objects| {
        objects
            .graphs
            .get(&graph)
            .copied()
            .ok_or(code::INVALID_HANDLE)
    })
}

/// Destroys a graph.
pub fn destroy_graph(graph: u64) -> i32 {
    OBJECTS.with(|objects| {
        if objects.graphs.remove(&graph).is_some() {
            code::SUCCESS
        } else {
            code::INVALID_HANDLE
        }
    })
}

/// Instantiates `graph` as an executable graph.
pub fn instantiate(graph: u64) -> Result<u64, i32> {
    OBJECTS.with(|objects| {
        let nodes = *objects.graphs.get(&graph).ok_or(code::INVALID_HANDLE)?;
        let handle = objects.handle(EXECUTABLE);
        objects.executables.insert(handle, nodes);
        Ok(handle)
    })
}

/// Whether `executable` is a live executable graph.
pub fn executable_known(executable: u64) -> bool {
    OBJECTS.with(|objects| objects.executables.contains_key(&executable))
}

/// Destroys an executable graph.
pub fn destroy_executable(executable: u64) -> i32 {
    OBJECTS.with(|objects| {
        if objects.executables.remove(&executable).is_some() {
            code::SUCCESS
        } else {
            code::INVALID_HANDLE
        }
    })
}

/// Starts capturing `stream` into a new graph.
pub fn begin_capture(stream: u64) -> Result<Capture, i32> {
    OBJECTS.with(|objects| {
        if objects.captures.contains_key(&stream) {
            return Err(code::ILLEGAL_STATE);
        }
        let graph = objects.handle(GRAPH);
        objects.graphs.insert(graph, 0);
        let capture = Capture {
            id: objects.next,
            graph,
        };
        objects.captures.insert(stream, capture);
        Ok(capture)
    })
}

/// The capture in progress on `stream`, if any.
pub fn capture(stream: u64) -> Option<Capture> {
    OBJECTS.with(|objects| objects.captures.get(&stream).copied())
}

/// Ends the capture on `stream`, returning its graph.
pub fn end_capture(stream: u64) -> Result<u64, i32> {
    OBJECTS.with(|objects| {
        objects
            .captures
            .remove(&stream)
            .map(|capture| capture.graph)
            .ok_or(code::ILLEGAL_STATE)
    })
}

/// Counts an operation on `stream`: a node of its graph when it is being captured.
pub fn stream_operation(stream: u64) {
    if let Some(capture) = capture(stream) {
        let _ = add_node(capture.graph);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn functions_and_globals_keep_their_handles() {
        let mut module = 0;
        assert_eq!(unsafe { new_module_into(&mut module) }, code::SUCCESS);
        let first = function(module, b"kernel").unwrap();
        assert_eq!(function(module, b"kernel").unwrap(), first);
        assert_ne!(function(module, b"other").unwrap(), first);
        let (name, owner) = function_info(first).unwrap();
        assert_eq!(
            unsafe { std::ffi::CStr::from_ptr(name) }.to_bytes(),
            b"kernel"
        );
        assert_eq!(owner, module);
        assert_eq!(global(module, b"g").unwrap(), global(module, b"g").unwrap());
        assert_eq!(unload_module(module), code::SUCCESS);
        assert_eq!(function_info(first).unwrap_err(), code::INVALID_HANDLE);
    }

    #[test]
    fn storage_is_per_context_and_key() {
        storage_put(1, 2, 3 as *mut c_void, None);
        storage_put(1, 2, 4 as *mut c_void, None);
        assert_eq!(storage_get(1, 2), Some(4 as *mut c_void));
        assert_eq!(storage_get(9, 2), None);
        assert_eq!(storage_delete(1, 2), code::SUCCESS);
        assert_eq!(storage_delete(1, 2), code::INVALID_HANDLE);
    }

    #[test]
    fn captures_collect_operations_as_nodes() {
        let started = begin_capture(77).unwrap();
        assert!(begin_capture(77).is_err());
        stream_operation(77);
        stream_operation(77);
        assert_eq!(end_capture(77).unwrap(), started.graph);
        assert_eq!(graph_nodes(started.graph).unwrap(), 2);
        assert!(capture(77).is_none());
    }
}
