//! A ggml backend that computes the Q8_0, Q5_0, Q4_0, Q4_1, Q4_K and Q6_K matrix products of
//! batches (verify batches, prompts) with `quant_matmul`, `avx2` and `k_quants`: one pass over
//! each weight matrix per batch instead of llama.cpp's one vector dot product per (weight row,
//! batch row), and the same bits; where `quant_matmul` runs, their single rows (plain decoding)
//! too; and flash attention over the Q8_0 KV cache with `attention` (each cache row read once
//! for the query rows that share a KV head), single query rows included.
//!
//! How it gets the work: llama.cpp gives every context one backend per registered
//! "accelerator" device, ahead of the CPU backend, and ggml's scheduler hands a matrix product
//! to the first backend that says it supports the product and the weights' buffer type (this is
//! how llama.cpp's BLAS backend works). This device accepts matrix products of weights in host
//! memory with two or more `f32` batch rows of Q8_0, Q5_0, Q4_0, Q4_1 (SmolLM2's layers), Q4_K
//! and Q6_K weights when the CPU has AVX2 (`avx2`, `k_quants`; `quant_matmul` takes Q8_0, Q5_0
//! and Q4_0, single rows included, when it has AVX-512 VNNI: [`WeightKind::fewest_rows`]), and
//! flash attention over a Q8_0 cache (`attention`, AVX2), a single query row included; the
//! other products' single rows and everything else stay with llama.cpp's CPU backend. The
//! weights stay where llama.cpp put them (llama.cpp's AMX buffers, on CPUs that have AMX, are
//! not host memory: llama.cpp computes their products, see docs/exactness.md).
//!
//! Gemma 3's output layer is Q8_0 and its layers mostly Q5_0 (their 640-wide rows do not fit
//! Q4_K's 256-value blocks), and llama.cpp's kernels unpack every block again for every batch
//! row: two thirds of a verify batch's time before. Q4_0 models (the default draft models) are
//! Q4_0 throughout, so a draft model's catch-up with a prompt is batched here too, and
//! SmolLM2's layers are Q4_1, which needs only AVX2. Sessions
//! check, when their context is made, that a batch decoded with this backend gives the logits
//! of decoding its tokens one by one, bit for bit, and turn the backend off for the process
//! otherwise (`engine::context`).
//!
//! The structures below mirror `ggml-backend-impl.h` (backend API version 3) of the
//! llama.cpp that llama-cpp-sys-2 0.1.161 builds (pinned in the workspace); llama-cpp-sys-2 does
//! not bind that internal header.

#![allow(unsafe_code)]

use std::cell::Cell;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::ptr::{self, NonNull};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use llama_cpp_sys_2 as sys;

use super::attention::Attention;
use super::avx2::{self, Avx2Weights, BlockQ4_1};
use super::k_quants::{BlockQ4K, BlockQ6K};
use super::quant_matmul::{
    self, BlockQ4_0, BlockQ5_0, BlockQ8_0, QuantBlock, QuantMatrix, WeightBlock,
};

/// `GGML_BACKEND_API_VERSION` of the mirrored header.
const API_VERSION: c_int = 3;
/// The device's name, as `spechost info` and llama.cpp's logs show it.
const NAME: &CStr = c"spechost-batch";
const DESCRIPTION: &CStr =
    c"spechost's batched Q8_0/Q5_0/Q4_0/Q4_1/Q4_K/Q6_K matrix products and Q8_0-cache attention";
/// The name under which llama.cpp looks up a backend's thread-count setter.
const SET_THREADS: &CStr = c"ggml_backend_set_n_threads";

/// Whether the device takes matrix products (off: it declines every one).
static ENABLED: AtomicBool = AtomicBool::new(false);
/// The registered device, made once per process.
static REGISTERED: OnceLock<Registered> = OnceLock::new();

thread_local! {
    /// Matrix products computed for graphs run by this thread (ggml runs a graph's splits on
    /// the thread that called `llama_decode`). Attention is not counted: the host computes it
    /// for every batch over the Q8_0 cache, also where llama.cpp's AMX buffers take the
    /// products, and the count says whose products a batch used.
    static PRODUCTS: Cell<u64> = const { Cell::new(0) };
}

/// How many matrix products the backend has computed for decodes made by this thread.
pub(in crate::engine) fn products_on_this_thread() -> u64 {
    PRODUCTS.get()
}

/// Registers the device with ggml, once per process, and turns it on; returns whether it is on
/// (not on a CPU with neither kernel's instructions). Contexts made afterwards use it.
pub(in crate::engine) fn enable() -> bool {
    if !WeightKind::ALL.iter().any(|kind| kind.kernel_available()) {
        return false;
    }
    REGISTERED.get_or_init(Registered::new);
    ENABLED.store(true, Ordering::Release);
    true
}

/// Turns the device off: contexts made afterwards leave every matrix product to llama.cpp.
pub(in crate::engine) fn disable() {
    ENABLED.store(false, Ordering::Release);
}

/// Whether contexts made now use the device.
pub(in crate::engine) fn enabled() -> bool {
    ENABLED.load(Ordering::Acquire)
}

/// The registry entry and its one device, leaked: ggml keeps pointers to them for good.
struct Registered {
    _registry: NonNull<Registry>,
}

// SAFETY: the registry and device are immutable after registration; ggml reads them from any
// thread, as it does its own backends'.
unsafe impl Send for Registered {}
// SAFETY: as above.
unsafe impl Sync for Registered {}

impl Registered {
    fn new() -> Self {
        let registry = Box::leak(Box::new(Registry {
            api_version: API_VERSION,
            iface: RegistryInterface {
                get_name: registry_name,
                get_device_count: registry_device_count,
                get_device: registry_device,
                get_proc_address: registry_proc_address,
            },
            context: ptr::null_mut(),
        }));
        let device = Box::leak(Box::new(Device {
            iface: DeviceInterface {
                get_name: device_name,
                get_description: device_description,
                get_memory: device_memory,
                get_type: device_type,
                get_props: device_props,
                init_backend: device_init_backend,
                get_buffer_type: device_buffer_type,
                get_host_buffer_type: None,
                buffer_from_host_ptr: None,
                supports_op: device_supports_op,
                supports_buft: device_supports_buft,
                offload_op: None,
                event_new: None,
                event_free: None,
                event_synchronize: None,
            },
            reg: ptr::from_mut(registry),
            context: ptr::null_mut(),
        }));
        registry.context = ptr::from_mut(device).cast();
        let registry = NonNull::from(registry);
        // SAFETY: a complete registry of the mirrored layout, alive for the process.
        unsafe { sys::ggml_backend_register(registry.as_ptr().cast()) };
        Self {
            _registry: registry,
        }
    }
}

/// A placeholder for an optional function of an interface that this backend leaves out.
type Absent = Option<unsafe extern "C" fn()>;

/// `struct ggml_backend_reg_i`.
#[repr(C)]
struct RegistryInterface {
    get_name: unsafe extern "C" fn(*mut Registry) -> *const c_char,
    get_device_count: unsafe extern "C" fn(*mut Registry) -> usize,
    get_device: unsafe extern "C" fn(*mut Registry, usize) -> *mut Device,
    get_proc_address: unsafe extern "C" fn(*mut Registry, *const c_char) -> *mut c_void,
}

/// `struct ggml_backend_reg`; `context` is the device.
#[repr(C)]
struct Registry {
    api_version: c_int,
    iface: RegistryInterface,
    context: *mut c_void,
}

/// `struct ggml_backend_device_i`.
#[repr(C)]
struct DeviceInterface {
    get_name: unsafe extern "C" fn(*mut Device) -> *const c_char,
    get_description: unsafe extern "C" fn(*mut Device) -> *const c_char,
    get_memory: unsafe extern "C" fn(*mut Device, *mut usize, *mut usize),
    get_type: unsafe extern "C" fn(*mut Device) -> sys::ggml_backend_dev_type,
    get_props: unsafe extern "C" fn(*mut Device, *mut sys::ggml_backend_dev_props),
    init_backend: unsafe extern "C" fn(*mut Device, *const c_char) -> *mut Backend,
    get_buffer_type: unsafe extern "C" fn(*mut Device) -> sys::ggml_backend_buffer_type_t,
    get_host_buffer_type: Absent,
    buffer_from_host_ptr: Absent,
    supports_op: unsafe extern "C" fn(*mut Device, *const sys::ggml_tensor) -> bool,
    supports_buft: unsafe extern "C" fn(*mut Device, sys::ggml_backend_buffer_type_t) -> bool,
    offload_op: Absent,
    event_new: Absent,
    event_free: Absent,
    event_synchronize: Absent,
}

/// `struct ggml_backend_device`.
#[repr(C)]
struct Device {
    iface: DeviceInterface,
    reg: *mut Registry,
    context: *mut c_void,
}

/// `struct ggml_backend_i`.
#[repr(C)]
struct BackendInterface {
    get_name: unsafe extern "C" fn(*mut Backend) -> *const c_char,
    free: unsafe extern "C" fn(*mut Backend),
    set_tensor_async: Absent,
    get_tensor_async: Absent,
    set_tensor_2d_async: Absent,
    get_tensor_2d_async: Absent,
    cpy_tensor_async: Absent,
    synchronize: Absent,
    graph_plan_create: Absent,
    graph_plan_free: Absent,
    graph_plan_update: Absent,
    graph_plan_compute: Absent,
    graph_compute: unsafe extern "C" fn(*mut Backend, *mut sys::ggml_cgraph) -> sys::ggml_status,
    event_record: Absent,
    event_wait: Absent,
    graph_optimize: Absent,
}

/// `struct ggml_backend`, one per llama.cpp context; `context` is its [`BackendState`].
#[repr(C)]
struct Backend {
    guid: *mut sys::ggml_guid,
    iface: BackendInterface,
    device: *mut Device,
    context: *mut c_void,
}

/// What a backend keeps between graphs.
struct BackendState {
    /// The thread count llama.cpp sets before each graph.
    threads: AtomicUsize,
}

/// The backend's GUID (ggml compares GUIDs to recognize a backend's kind; it never writes one).
static GUID: sys::ggml_guid = *b"spechost-batch\0\0";

unsafe extern "C" fn registry_name(_: *mut Registry) -> *const c_char {
    NAME.as_ptr()
}

unsafe extern "C" fn registry_device_count(_: *mut Registry) -> usize {
    1
}

unsafe extern "C" fn registry_device(registry: *mut Registry, index: usize) -> *mut Device {
    assert_eq!(index, 0, "the registry has one device");
    // SAFETY: ggml passes the registry registered in `Registered::new`.
    unsafe { (*registry).context.cast() }
}

unsafe extern "C" fn registry_proc_address(_: *mut Registry, name: *const c_char) -> *mut c_void {
    // SAFETY: ggml passes a NUL-terminated name.
    if !name.is_null() && unsafe { CStr::from_ptr(name) } == SET_THREADS {
        let set: unsafe extern "C" fn(*mut Backend, c_int) = backend_set_threads;
        set as *mut c_void
    } else {
        ptr::null_mut()
    }
}

unsafe extern "C" fn device_name(_: *mut Device) -> *const c_char {
    NAME.as_ptr()
}

unsafe extern "C" fn device_description(_: *mut Device) -> *const c_char {
    DESCRIPTION.as_ptr()
}

unsafe extern "C" fn device_memory(_: *mut Device, free: *mut usize, total: *mut usize) {
    // SAFETY: ggml passes two writable sizes. No memory of its own: 0 says nothing to report.
    unsafe {
        *free = 0;
        *total = 0;
    }
}

unsafe extern "C" fn device_type(_: *mut Device) -> sys::ggml_backend_dev_type {
    sys::GGML_BACKEND_DEVICE_TYPE_ACCEL
}

unsafe extern "C" fn device_props(device: *mut Device, props: *mut sys::ggml_backend_dev_props) {
    // SAFETY: ggml passes a writable properties struct.
    unsafe {
        *props = sys::ggml_backend_dev_props {
            name: device_name(device),
            description: device_description(device),
            memory_free: 0,
            memory_total: 0,
            type_: sys::GGML_BACKEND_DEVICE_TYPE_ACCEL,
            device_id: ptr::null(),
            caps: sys::ggml_backend_dev_caps {
                async_: false,
                host_buffer: false,
                buffer_from_host_ptr: false,
                events: false,
                mmap_support: false,
            },
        };
    }
}

unsafe extern "C" fn device_init_backend(device: *mut Device, _: *const c_char) -> *mut Backend {
    let state = Box::new(BackendState {
        threads: AtomicUsize::new(1),
    });
    Box::into_raw(Box::new(Backend {
        guid: ptr::from_ref(&GUID).cast_mut(),
        iface: BackendInterface {
            get_name: backend_name,
            free: backend_free,
            set_tensor_async: None,
            get_tensor_async: None,
            set_tensor_2d_async: None,
            get_tensor_2d_async: None,
            cpy_tensor_async: None,
            synchronize: None,
            graph_plan_create: None,
            graph_plan_free: None,
            graph_plan_update: None,
            graph_plan_compute: None,
            graph_compute: backend_graph_compute,
            event_record: None,
            event_wait: None,
            graph_optimize: None,
        },
        device,
        context: Box::into_raw(state).cast(),
    }))
}

/// Outputs land in ordinary host memory, as the CPU backend's do.
unsafe extern "C" fn device_buffer_type(_: *mut Device) -> sys::ggml_backend_buffer_type_t {
    // SAFETY: ggml's CPU buffer type is a static.
    unsafe { sys::ggml_backend_cpu_buffer_type() }
}

unsafe extern "C" fn device_supports_buft(
    _: *mut Device,
    buft: sys::ggml_backend_buffer_type_t,
) -> bool {
    // SAFETY: ggml passes a live buffer type.
    unsafe { sys::ggml_backend_buft_is_host(buft) }
}

unsafe extern "C" fn device_supports_op(_: *mut Device, op: *const sys::ggml_tensor) -> bool {
    // SAFETY: ggml passes a live tensor whose sources are live.
    enabled()
        && unsafe { op.as_ref() }
            .is_some_and(|op| unsafe { product_of(op).is_some() || Attention::of(op).is_some() })
}

unsafe extern "C" fn backend_name(_: *mut Backend) -> *const c_char {
    NAME.as_ptr()
}

unsafe extern "C" fn backend_free(backend: *mut Backend) {
    // SAFETY: made by `device_init_backend`; ggml frees each backend once.
    unsafe {
        let backend = Box::from_raw(backend);
        drop(Box::from_raw(backend.context.cast::<BackendState>()));
    }
}

unsafe extern "C" fn backend_set_threads(backend: *mut Backend, threads: c_int) {
    // SAFETY: llama.cpp passes a backend of this device.
    let state = unsafe { &*(*backend).context.cast::<BackendState>() };
    state
        .threads
        .store(threads.max(1) as usize, Ordering::Relaxed);
}

unsafe extern "C" fn backend_graph_compute(
    backend: *mut Backend,
    graph: *mut sys::ggml_cgraph,
) -> sys::ggml_status {
    // SAFETY: ggml passes a backend of this device.
    let threads = unsafe { &*(*backend).context.cast::<BackendState>() }
        .threads
        .load(Ordering::Relaxed);
    // A panic must not unwind into C++; ggml reports a failed status as a failed decode.
    let computed = std::panic::catch_unwind(|| {
        // SAFETY: ggml passes the graph of nodes it assigned to this backend.
        let nodes = unsafe { sys::ggml_graph_n_nodes(graph) };
        (0..nodes).all(|index| {
            // SAFETY: `index` is within the graph; the node and its sources are allocated.
            let node = unsafe { &*sys::ggml_graph_node(graph, index) };
            match node.op {
                // SAFETY: as above; the scheduler only assigns products `supports_op` took.
                sys::GGML_OP_MUL_MAT => unsafe { product_of(node) }
                    .map(|product| {
                        product.compute(threads);
                        PRODUCTS.set(PRODUCTS.get() + 1);
                    })
                    .is_some(),
                // SAFETY: as above; the scheduler only assigns attention `supports_op` took,
                // whose output ggml allocated apart from its inputs.
                sys::GGML_OP_FLASH_ATTN_EXT => unsafe { Attention::of(node) }
                    .map(|attention| {
                        // SAFETY: `Attention::of` checked the layout and the instructions.
                        unsafe { attention.compute(threads) };
                    })
                    .is_some(),
                // Views compute nothing (the scheduler may place one next to a product).
                sys::GGML_OP_NONE
                | sys::GGML_OP_RESHAPE
                | sys::GGML_OP_VIEW
                | sys::GGML_OP_PERMUTE
                | sys::GGML_OP_TRANSPOSE => true,
                _ => false,
            }
        })
    });
    match computed {
        Ok(true) => sys::GGML_STATUS_SUCCESS,
        _ => sys::GGML_STATUS_FAILED,
    }
}

/// A matrix product this backend computes: `weights` (`rows` × `width`, of a [`WeightKind`]) times
/// each of `batch` rows of `width` floats at `input`, into `batch` rows of `rows` floats at
/// `output`.
struct Product {
    kind: WeightKind,
    weights: *const u8,
    rows: usize,
    width: usize,
    batch: usize,
    input: *const u8,
    input_stride: usize,
    output: *mut u8,
    output_stride: usize,
}

/// The weight types the kernels take.
#[derive(Clone, Copy)]
enum WeightKind {
    Q8_0,
    Q5_0,
    Q4_0,
    Q4_1,
    Q4K,
    Q6K,
}

impl WeightKind {
    const ALL: [Self; 6] = [
        Self::Q8_0,
        Self::Q5_0,
        Self::Q4_0,
        Self::Q4_1,
        Self::Q4K,
        Self::Q6K,
    ];

    /// The kind of `ggml_type`, if a kernel for it runs on this CPU.
    fn of(ggml_type: sys::ggml_type) -> Option<Self> {
        let kind = match ggml_type {
            sys::GGML_TYPE_Q8_0 => Self::Q8_0,
            sys::GGML_TYPE_Q5_0 => Self::Q5_0,
            sys::GGML_TYPE_Q4_0 => Self::Q4_0,
            sys::GGML_TYPE_Q4_1 => Self::Q4_1,
            sys::GGML_TYPE_Q4_K => Self::Q4K,
            sys::GGML_TYPE_Q6_K => Self::Q6K,
            _ => return None,
        };
        kind.kernel_available().then_some(kind)
    }

    /// Whether a kernel for this kind runs on this CPU.
    fn kernel_available(self) -> bool {
        match self {
            Self::Q8_0 | Self::Q5_0 | Self::Q4_0 => {
                quant_matmul::kernel_available() || avx2::kernel_available()
            }
            Self::Q4_1 | Self::Q4K | Self::Q6K => avx2::kernel_available(),
        }
    }

    /// Fewest batch rows of a product of this kind the backend takes. One where `quant_matmul`
    /// computes it (AVX-512 VNNI): its single row, what plain decoding multiplies, is faster than
    /// ggml's dot products (measured on a 2-vCPU Xeon with the weights in plain CPU buffers, a
    /// token of SmolLM2 Q8_0 in 10.4 ms against 13.6, of Gemma-3-270M, whose Q5_0 layers and
    /// Q8_0 output layer it takes, in 14.5 against 16.4), with the same bits. Two where the AVX2
    /// kernels compute it: their single row ran slower than ggml's (a token of SmolLM2 Q4_1 in
    /// 13.7-14.3 ms against 11.2-12.3).
    fn fewest_rows(self) -> usize {
        match self {
            Self::Q8_0 | Self::Q5_0 | Self::Q4_0 if quant_matmul::kernel_available() => 1,
            _ => 2,
        }
    }

    /// Bytes and values of one block.
    fn block_layout(self) -> (usize, usize) {
        fn of<B: QuantBlock>() -> (usize, usize) {
            (size_of::<B>(), B::VALUES)
        }
        match self {
            Self::Q8_0 => of::<BlockQ8_0>(),
            Self::Q5_0 => of::<BlockQ5_0>(),
            Self::Q4_0 => of::<BlockQ4_0>(),
            Self::Q4_1 => of::<BlockQ4_1>(),
            Self::Q4K => of::<BlockQ4K>(),
            Self::Q6K => of::<BlockQ6K>(),
        }
    }
}

/// The product `node` asks for, if it is one this backend computes: a 2-D matrix product of
/// weights of a [`WeightKind`] with contiguous rows and contiguous `f32` batch rows, at least
/// [`WeightKind::fewest_rows`] of them.
///
/// # Safety
/// `node` and its sources must be live tensors.
unsafe fn product_of(node: &sys::ggml_tensor) -> Option<Product> {
    if node.op != sys::GGML_OP_MUL_MAT || node.type_ != sys::GGML_TYPE_F32 {
        return None;
    }
    // SAFETY: the caller guarantees live sources.
    let (weights, input) = unsafe { (node.src[0].as_ref()?, node.src[1].as_ref()?) };
    let kind = WeightKind::of(weights.type_)?;
    let (block_bytes, block_values) = kind.block_layout();
    let [width, rows, batch] = [weights.ne[0], weights.ne[1], input.ne[1]].map(|n| n as usize);
    let float = size_of::<f32>();
    let two_dimensional = [weights, input, node]
        .iter()
        .all(|tensor| tensor.ne[2] == 1 && tensor.ne[3] == 1);
    let supported = two_dimensional
        && input.type_ == sys::GGML_TYPE_F32
        && batch >= kind.fewest_rows()
        && width.is_multiple_of(block_values)
        && input.ne[0] as usize == width
        && node.ne[0] as usize == rows
        && node.ne[1] as usize == batch
        && weights.nb[0] == block_bytes
        && weights.nb[1] == width / block_values * block_bytes
        && input.nb[0] == float
        && input.nb[1] >= width * float
        && node.nb[0] == float
        && node.nb[1] >= rows * float;
    supported.then(|| Product {
        kind,
        weights: weights.data.cast(),
        rows,
        width,
        batch,
        input: input.data.cast(),
        input_stride: input.nb[1],
        output: node.data.cast(),
        output_stride: node.nb[1],
    })
}

impl Product {
    /// Computes the product on `threads` threads.
    fn compute(mut self, threads: usize) {
        let vnni = quant_matmul::kernel_available();
        match self.kind {
            WeightKind::Q8_0 if vnni => self.compute_vnni::<BlockQ8_0>(threads),
            WeightKind::Q5_0 if vnni => self.compute_vnni::<BlockQ5_0>(threads),
            WeightKind::Q4_0 if vnni => self.compute_vnni::<BlockQ4_0>(threads),
            WeightKind::Q8_0 => self.compute_avx2::<BlockQ8_0>(threads),
            WeightKind::Q5_0 => self.compute_avx2::<BlockQ5_0>(threads),
            WeightKind::Q4_0 => self.compute_avx2::<BlockQ4_0>(threads),
            WeightKind::Q4_1 => self.compute_avx2::<BlockQ4_1>(threads),
            WeightKind::Q4K => self.compute_avx2::<BlockQ4K>(threads),
            WeightKind::Q6K => self.compute_avx2::<BlockQ6K>(threads),
        }
    }

    /// With `quant_matmul` (AVX-512 VNNI).
    fn compute_vnni<B: WeightBlock>(&mut self, threads: usize) {
        let (matrix, inputs, mut outputs) = self.operands::<B>();
        quant_matmul::multiply(&matrix, &inputs, &mut outputs, threads);
    }

    /// With `avx2`.
    fn compute_avx2<B: Avx2Weights>(&mut self, threads: usize) {
        let (matrix, inputs, mut outputs) = self.operands::<B>();
        avx2::multiply(&matrix, &inputs, &mut outputs, threads);
    }

    /// The weights as a matrix of blocks of `B`, the batch rows and the output rows.
    #[allow(clippy::type_complexity)]
    fn operands<B: QuantBlock>(&mut self) -> (QuantMatrix<'_, B>, Vec<&[f32]>, Vec<&mut [f32]>) {
        // SAFETY: `product_of` checked the shapes and strides against the tensors, which the
        // scheduler allocated in host memory (this device only takes host buffers): `rows`
        // contiguous rows of blocks of `B`, `batch` input rows of `width` floats, `batch`
        // output rows of `rows` floats that no input overlaps; ggml aligns tensor data beyond
        // 4 bytes.
        unsafe {
            let blocks = std::slice::from_raw_parts(
                self.weights.cast::<B>(),
                self.rows * self.width / B::VALUES,
            );
            let inputs: Vec<&[f32]> = (0..self.batch)
                .map(|row| {
                    let start = self.input.add(row * self.input_stride).cast::<f32>();
                    std::slice::from_raw_parts(start, self.width)
                })
                .collect();
            let outputs: Vec<&mut [f32]> = (0..self.batch)
                .map(|row| {
                    let start = self.output.add(row * self.output_stride).cast::<f32>();
                    std::slice::from_raw_parts_mut(start, self.rows)
                })
                .collect();
            (
                QuantMatrix::new(blocks, self.rows, self.width),
                inputs,
                outputs,
            )
        }
    }
}
