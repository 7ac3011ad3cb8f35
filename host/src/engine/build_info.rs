//! What the llama.cpp inside this binary was built with, for `spechost info`: its backend
//! devices, the OpenMP runtime, the SIMD extensions of the build, and the ggml settings of
//! `.cargo/config.toml`.

use std::collections::BTreeMap;

use serde::Serialize;

/// One ggml backend device (the CPU, or an accelerator when one was compiled in).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BackendDevice {
    /// Device name (`CPU`).
    pub name: String,
    /// What ggml says it is (the CPU model for the CPU backend).
    pub description: String,
    /// The backend (`CPU`, `CUDA`, ...).
    pub backend: String,
}

/// The llama.cpp build inside this binary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BuildInfo {
    /// ggml's backend devices.
    pub devices: Vec<BackendDevice>,
    /// The OpenMP runtime loaded into this process (llama.cpp's thread pool), if any.
    pub openmp_runtime: Option<String>,
    /// SIMD extensions the build targets. `.cargo/config.toml` builds with
    /// `target-cpu=native`, which llama-cpp-sys-2 turns into `GGML_NATIVE=ON`, so llama.cpp was
    /// compiled for the same extensions as this crate.
    pub simd: Vec<&'static str>,
    /// ggml switches passed to llama.cpp's build (`GGML_CPU_REPACK=OFF`, ...), as `.cargo/config.toml`
    /// set them; a switch not listed kept llama.cpp's default.
    pub ggml_settings: BTreeMap<&'static str, &'static str>,
    /// Whether llama.cpp can map model files (`--no-mmap` turns it off).
    pub mmap: bool,
    /// Whether llama.cpp can lock weights in RAM (`--mlock`).
    pub mlock: bool,
}

/// The x86-64 and AArch64 extensions ggml has kernels for, in the order llama.cpp prints them.
macro_rules! enabled_target_features {
    ($($feature:literal),* $(,)?) => {
        [$((cfg!(target_feature = $feature), $feature)),*]
            .into_iter()
            .filter_map(|(enabled, name)| enabled.then_some(name))
            .collect::<Vec<&'static str>>()
    };
}

impl BuildInfo {
    /// Asks llama.cpp for its devices and this process for its OpenMP runtime.
    pub fn detect() -> Self {
        let devices = llama_cpp_2::list_llama_ggml_backend_devices()
            .into_iter()
            .map(|device| BackendDevice {
                name: device.name,
                description: device.description,
                backend: device.backend,
            })
            .collect();
        let simd = enabled_target_features!(
            "sse3",
            "ssse3",
            "avx",
            "f16c",
            "fma",
            "avx2",
            "bmi2",
            "avxvnni",
            "avx512f",
            "avx512bw",
            "avx512vl",
            "avx512vbmi",
            "avx512vnni",
            "avx512bf16",
            "neon",
            "dotprod",
            "i8mm",
            "sve",
        );
        let ggml_settings = [
            ("GGML_CPU_REPACK", option_env!("GGML_CPU_REPACK")),
            ("GGML_LLAMAFILE", option_env!("GGML_LLAMAFILE")),
        ]
        .into_iter()
        .filter_map(|(name, value)| Some((name, value?)))
        .collect();
        Self {
            devices,
            openmp_runtime: loaded_library("libgomp").or_else(|| loaded_library("libomp")),
            simd,
            ggml_settings,
            mmap: llama_cpp_2::mmap_supported(),
            mlock: llama_cpp_2::mlock_supported(),
        }
    }

    /// One line per fact, `label  value`, for `spechost info`.
    pub fn render(&self) -> String {
        let devices = self
            .devices
            .iter()
            .map(|d| format!("{} ({}: {})", d.name, d.backend, d.description))
            .collect::<Vec<_>>()
            .join(", ");
        let settings = self
            .ggml_settings
            .iter()
            .map(|(name, value)| format!("{name}={value}"))
            .collect::<Vec<_>>()
            .join(" ");
        let yes_no = |b: bool| if b { "yes" } else { "no" };
        [
            ("devices", devices),
            (
                "OpenMP",
                self.openmp_runtime
                    .clone()
                    .unwrap_or_else(|| "not loaded (ggml's own thread pool)".into()),
            ),
            ("SIMD", self.simd.join(" ")),
            ("ggml settings", settings),
            (
                "mmap / mlock",
                format!("{} / {}", yes_no(self.mmap), yes_no(self.mlock)),
            ),
        ]
        .iter()
        .map(|(label, value)| format!("  {label:<15}{value}\n"))
        .collect()
    }
}

/// The path of the first shared library mapped into this process whose file name starts with
/// `prefix`, from `/proc/self/maps`.
fn loaded_library(prefix: &str) -> Option<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .find(|path| {
            path.rsplit('/')
                .next()
                .is_some_and(|file| file.starts_with(prefix))
        })
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_the_cpu_device_and_openmp() {
        let info = BuildInfo::detect();
        assert!(
            info.devices.iter().any(|d| d.backend == "CPU"),
            "no CPU backend in {:?}",
            info.devices
        );
        let runtime = info.openmp_runtime.clone().unwrap_or_default();
        assert!(
            runtime.contains("libgomp"),
            "llama-cpp-2 is built with `openmp`, so libgomp is loaded; got {runtime:?}"
        );
        assert!(
            info.ggml_settings.get("GGML_CPU_REPACK") == Some(&"OFF"),
            "the batch-invariant build switches repacking off: {:?}",
            info.ggml_settings
        );
        assert!(info.render().contains("CPU (CPU: "), "{}", info.render());
    }
}
