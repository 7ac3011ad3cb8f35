//! Reading the kernel's text files under a root directory: `/` on a live machine, a fixture
//! tree in tests.

use std::path::{Path, PathBuf};

use super::cpulist::CpuList;

/// Why the machine's layout cannot be read. The message names the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TopologyError {
    /// A file every Linux system has is missing or unreadable.
    #[error(
        "cannot read {path}: {source}; spechost reads the CPU layout from Linux sysfs (is /sys mounted?)"
    )]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file holds something other than what the kernel writes there.
    #[error("cannot parse {path}: {problem}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
}

/// A directory standing for `/`: paths given to it are relative (`sys/devices/...`).
#[derive(Debug, Clone)]
pub(super) struct Root {
    dir: PathBuf,
}

impl Root {
    pub(super) fn new(dir: &Path) -> Self {
        Self {
            dir: dir.to_owned(),
        }
    }

    pub(super) fn path(&self, relative: &str) -> PathBuf {
        self.dir.join(relative)
    }

    /// The file's text, or `None` when it does not exist or cannot be read (optional facts:
    /// containers and older kernels leave some out).
    pub(super) fn read(&self, relative: &str) -> Option<String> {
        std::fs::read_to_string(self.path(relative)).ok()
    }

    /// The file's text; an error when it cannot be read.
    pub(super) fn require(&self, relative: &str) -> Result<String, TopologyError> {
        let path = self.path(relative);
        std::fs::read_to_string(&path).map_err(|source| TopologyError::Read { path, source })
    }

    /// A CPU list file (`online`, `cpulist`, `thread_siblings_list`, ...), if present.
    pub(super) fn cpu_list(&self, relative: &str) -> Result<Option<CpuList>, TopologyError> {
        self.read(relative)
            .map(|text| self.parse_cpu_list(relative, &text))
            .transpose()
    }

    /// Parses `text`, read from `relative`, as a CPU list.
    pub(super) fn parse_cpu_list(
        &self,
        relative: &str,
        text: &str,
    ) -> Result<CpuList, TopologyError> {
        text.parse()
            .map_err(|e: super::CpuListError| TopologyError::Parse {
                path: self.path(relative),
                problem: e.problem,
            })
    }

    /// A file holding one number, if present and numeric.
    pub(super) fn number(&self, relative: &str) -> Option<u64> {
        self.read(relative)?.trim().parse().ok()
    }

    /// The entries of a directory whose names are `prefix`, a number, then `suffix`
    /// (`node3`, `hugepages-2048kB`), as `(number, name)`, sorted by number.
    pub(super) fn numbered_entries(
        &self,
        relative: &str,
        prefix: &str,
        suffix: &str,
    ) -> Vec<(u64, String)> {
        let Ok(entries) = std::fs::read_dir(self.path(relative)) else {
            return Vec::new();
        };
        let mut found: Vec<(u64, String)> = entries
            .filter_map(|entry| {
                let name = entry.ok()?.file_name().into_string().ok()?;
                let number = name
                    .strip_prefix(prefix)?
                    .strip_suffix(suffix)?
                    .parse()
                    .ok()?;
                Some((number, name))
            })
            .collect();
        found.sort_unstable();
        found
    }
}

/// The value of `key` in `Key: value` lines (`/proc/meminfo`, `/proc/cpuinfo`,
/// `/proc/self/status`, a node's `meminfo` after its `Node N ` prefix).
pub(super) fn field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        (name.trim() == key).then(|| value.trim())
    })
}

/// A `1234 kB` value in KiB.
pub(super) fn kib_field(text: &str, key: &str) -> Option<u64> {
    field(text, key)?.trim_end_matches("kB").trim().parse().ok()
}

/// A cache size as sysfs writes it (`48K`, `1024K`, `32768K`; `M`/`G` accepted) in KiB.
pub(super) fn size_kib(text: &str) -> Option<u64> {
    let text = text.trim();
    let (digits, scale) = match text.chars().last()? {
        'K' => (&text[..text.len() - 1], 1),
        'M' => (&text[..text.len() - 1], 1024),
        'G' => (&text[..text.len() - 1], 1024 * 1024),
        _ => return text.parse::<u64>().ok().map(|bytes| bytes / 1024),
    };
    digits.parse::<u64>().ok().map(|n| n * scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_key_value_fields() {
        let meminfo =
            "MemTotal:       24684092 kB\nHugePages_Total:       4\nNode 0 MemFree: 7 kB\n";
        assert_eq!(kib_field(meminfo, "MemTotal"), Some(24_684_092));
        assert_eq!(field(meminfo, "HugePages_Total"), Some("4"));
        assert_eq!(field(meminfo, "Missing"), None);
    }

    #[test]
    fn parses_cache_sizes() {
        assert_eq!(size_kib("48K\n"), Some(48));
        assert_eq!(size_kib("32M"), Some(32 * 1024));
        assert_eq!(size_kib("2048"), Some(2));
        assert_eq!(size_kib("big"), None);
    }
}
