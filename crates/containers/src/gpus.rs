//! The machine's GPUs, handed out to containers one GPU to one container
//! (Docker).
//!
//! Docker's NVIDIA driver answers a request for a count of GPUs with the
//! machine's first GPUs, whoever else has them: two pods of one GPU each
//! would share GPU 0 while each is billed for a GPU of its own. So where
//! Gantry knows the machine's GPUs (the `serverless.gpu_devices` setting, or
//! what `nvidia-smi` lists), it chooses free ones and asks for them by id.
//! Which GPUs a container has is a label on the container
//! ([`LABEL_GPUS`]), so the engine itself says which are taken, across
//! restarts of Gantry; the choices not yet visible there (a container being
//! made) are held in memory until it is.
//!
//! A GPU is taken while a container that has it is running or about to; a
//! stopped container keeps its label, and gets the same GPUs when it starts
//! again, once they are free.
//!
//! `nvidia-smi` also gives what a running pod's GPUs are doing (`runtime.gpus`
//! of a pod).

use std::collections::{BTreeMap, HashSet};
use std::io::Read as _;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::fleet::lock;

/// Label of a container that was given GPUs by id: their ids, comma-separated.
pub const LABEL_GPUS: &str = "gantry.gpus";

/// How long one `nvidia-smi` call may take.
const SMI_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a reading of the GPUs' use is reused.
const USAGE_FRESH: Duration = Duration::from_secs(1);

/// One GPU as `nvidia-smi` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuReading {
    pub index: String,
    pub uuid: String,
    /// Percent of the last sample period a kernel ran.
    pub util: u32,
    /// Percent of the GPU's memory in use.
    pub memory_util: u32,
}

/// What a container asking for GPUs gets.
pub enum Grant<'p> {
    /// The machine's GPUs are unknown: ask the engine for a count (its first
    /// GPUs), as before Gantry knew better.
    ByCount,
    /// These GPUs, held for the container until it is made.
    Devices(Reservation<'p>),
    /// Not now: too few are free (the reason says how many are taken).
    Wait(String),
    /// Never on this machine: it has fewer GPUs than asked for.
    Never(String),
}

/// GPUs chosen for a container that is being made; given back when dropped
/// (the container then holds them by its label, or was not made).
pub struct Reservation<'p> {
    pool: &'p GpuPool,
    pub devices: Vec<String>,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        let mut reserved = lock(&self.pool.reserved);
        for device in &self.devices {
            reserved.remove(device);
        }
    }
}

/// The machine's GPUs and who has them.
pub struct GpuPool {
    /// The ids Gantry hands out, in order; `None` when unknown.
    devices: Option<Vec<String>>,
    /// Chosen for containers being made.
    reserved: Mutex<HashSet<String>>,
    /// The `nvidia-smi` to ask for the GPUs' use; `None`: not asked.
    nvidia_smi: Option<PathBuf>,
    usage: Mutex<Option<(Instant, Vec<GpuReading>)>>,
}

impl GpuPool {
    /// A pool of `devices` (`None`: unknown, GPUs are asked for by count),
    /// whose use `nvidia_smi` reads.
    pub fn new(devices: Option<Vec<String>>, nvidia_smi: Option<PathBuf>) -> GpuPool {
        GpuPool {
            devices,
            reserved: Mutex::new(HashSet::new()),
            nvidia_smi,
            usage: Mutex::new(None),
        }
    }

    /// The machine's GPUs as `nvidia_smi` lists them (their indexes), or
    /// `None` when it cannot be run (no NVIDIA driver here).
    pub fn discover(nvidia_smi: &std::path::Path) -> Option<Vec<String>> {
        match query(nvidia_smi) {
            Ok(readings) => Some(readings.into_iter().map(|r| r.index).collect()),
            Err(error) => {
                tracing::info!(%error, command = %nvidia_smi.display(), "no GPUs found to hand out by id");
                None
            }
        }
    }

    /// The GPUs handed out, when known.
    pub fn devices(&self) -> Option<&[String]> {
        self.devices.as_deref()
    }

    /// Chooses `wanted` GPUs that no container in `in_use` has and no other
    /// container being made holds.
    pub fn reserve(&self, wanted: u32, in_use: &HashSet<String>) -> Grant<'_> {
        let Some(devices) = &self.devices else {
            return Grant::ByCount;
        };
        let wanted = wanted as usize;
        if wanted > devices.len() {
            return Grant::Never(format!(
                "{wanted} GPU{} asked for, and this machine has {}",
                plural(wanted),
                devices.len()
            ));
        }
        let mut reserved = lock(&self.reserved);
        let free: Vec<String> = devices
            .iter()
            .filter(|d| !in_use.contains(*d) && !reserved.contains(*d))
            .take(wanted)
            .cloned()
            .collect();
        if free.len() < wanted {
            let taken = devices
                .iter()
                .filter(|d| in_use.contains(*d) || reserved.contains(*d))
                .count();
            return Grant::Wait(format!(
                "waiting for {wanted} free GPU{}: {taken} of this machine's {} are in use",
                plural(wanted),
                devices.len()
            ));
        }
        reserved.extend(free.iter().cloned());
        drop(reserved);
        Grant::Devices(Reservation {
            pool: self,
            devices: free,
        })
    }

    /// Holds `devices` (a stopped container's own) for its start again, if
    /// none of them is in use or held; else says which are.
    pub fn reserve_these(&self, devices: &[String], in_use: &HashSet<String>) -> Result<Reservation<'_>, String> {
        let mut reserved = lock(&self.reserved);
        let busy: Vec<&str> = devices
            .iter()
            .filter(|d| in_use.contains(*d) || reserved.contains(*d))
            .map(String::as_str)
            .collect();
        if !busy.is_empty() {
            return Err(format!(
                "waiting for its GPU{} {} to be free: another container has {}",
                plural(busy.len()),
                busy.join(", "),
                if busy.len() == 1 { "it" } else { "them" }
            ));
        }
        reserved.extend(devices.iter().cloned());
        drop(reserved);
        Ok(Reservation {
            pool: self,
            devices: devices.to_vec(),
        })
    }

    /// What each of `devices` (indexes or UUIDs) is doing, in their order;
    /// `None` when `nvidia-smi` is not asked or does not answer. Readings
    /// are reused for a second.
    pub async fn usage(&self, devices: &[String]) -> Option<Vec<GpuReading>> {
        let smi = self.nvidia_smi.clone()?;
        let cached = lock(&self.usage)
            .as_ref()
            .filter(|(at, _)| at.elapsed() < USAGE_FRESH)
            .map(|(_, readings)| readings.clone());
        let readings = match cached {
            Some(readings) => readings,
            None => {
                let readings = match tokio::task::spawn_blocking(move || query(&smi)).await {
                    Ok(Ok(readings)) => readings,
                    Ok(Err(error)) => {
                        tracing::debug!(%error, "nvidia-smi did not answer");
                        return None;
                    }
                    Err(_) => return None,
                };
                *lock(&self.usage) = Some((Instant::now(), readings.clone()));
                readings
            }
        };
        devices
            .iter()
            .map(|d| readings.iter().find(|r| &r.index == d || &r.uuid == d).cloned())
            .collect()
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// The GPUs of a container's label.
pub fn devices_of(labels: &BTreeMap<String, String>) -> Vec<String> {
    labels
        .get(LABEL_GPUS)
        .map(|ids| ids.split(',').filter(|d| !d.is_empty()).map(str::to_owned).collect())
        .unwrap_or_default()
}

/// Runs `nvidia-smi` for every GPU's index, UUID, use and memory, killed
/// after [`SMI_TIMEOUT`].
fn query(smi: &std::path::Path) -> Result<Vec<GpuReading>, String> {
    let mut child = std::process::Command::new(smi)
        .args([
            "--query-gpu=index,uuid,utilization.gpu,memory.used,memory.total",
            "--format=csv,noheader,nounits",
        ])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| e.to_string())?;
    let deadline = Instant::now() + SMI_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("no answer within {} s", SMI_TIMEOUT.as_secs()));
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut out = String::new();
    if let Some(mut pipe) = child.stdout.take() {
        pipe.read_to_string(&mut out).map_err(|e| e.to_string())?;
    }
    if !status.success() {
        return Err(format!("exited with {status}"));
    }
    parse_readings(&out)
}

/// Parses `index, uuid, util %, memory used MiB, memory total MiB` lines.
fn parse_readings(text: &str) -> Result<Vec<GpuReading>, String> {
    text.lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            let fields: Vec<&str> = line.split(',').map(str::trim).collect();
            let [index, uuid, util, used, total] = fields[..] else {
                return Err(format!("unexpected nvidia-smi line {line:?}"));
            };
            // A figure the GPU does not report is `[N/A]`: taken as 0.
            let number = |s: &str| s.parse::<f64>().unwrap_or(0.0);
            let total = number(total);
            Ok(GpuReading {
                index: index.to_owned(),
                uuid: uuid.to_owned(),
                util: number(util).clamp(0.0, 100.0).round() as u32,
                memory_util: if total > 0.0 {
                    (number(used) / total * 100.0).clamp(0.0, 100.0).round() as u32
                } else {
                    0
                },
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(n: usize) -> GpuPool {
        GpuPool::new(Some((0..n).map(|i| i.to_string()).collect()), None)
    }

    #[test]
    fn free_gpus_are_given_once_until_given_back() {
        let pool = pool(3);
        let none = HashSet::new();
        let Grant::Devices(first) = pool.reserve(2, &none) else {
            panic!("two of three are free")
        };
        assert_eq!(first.devices, ["0", "1"]);
        // Held while the first container is made: only one is left.
        assert!(matches!(pool.reserve(2, &none), Grant::Wait(reason) if reason.contains("2 of this machine's 3")));
        let Grant::Devices(second) = pool.reserve(1, &none) else {
            panic!("one is free")
        };
        assert_eq!(second.devices, ["2"]);
        drop(first);
        // Now the engine says GPU 1 is taken (the container was made).
        let taken: HashSet<String> = ["1".to_owned()].into();
        let Grant::Devices(third) = pool.reserve(1, &taken) else {
            panic!("GPU 0 is free again")
        };
        assert_eq!(third.devices, ["0"]);
        assert!(matches!(pool.reserve(4, &none), Grant::Never(_)));
        assert!(matches!(GpuPool::new(None, None).reserve(1, &none), Grant::ByCount));
    }

    #[test]
    fn a_stopped_containers_own_gpus_are_held_again_only_when_free() {
        let pool = pool(2);
        let taken: HashSet<String> = ["1".to_owned()].into();
        let error = pool
            .reserve_these(&["1".to_owned()], &taken)
            .err()
            .expect("GPU 1 is taken");
        assert!(error.contains("GPU 1 to be free"), "{error}");
        let held = pool.reserve_these(&["0".to_owned()], &taken).unwrap();
        assert!(pool.reserve_these(&["0".to_owned()], &HashSet::new()).is_err());
        drop(held);
        assert!(pool.reserve_these(&["0".to_owned()], &HashSet::new()).is_ok());
    }

    #[test]
    fn nvidia_smi_lines_are_read() {
        let text = "0, GPU-aaaa, 94, 62914, 81559\n1, GPU-bbbb, [N/A], 0, 81559\n";
        let readings = parse_readings(text).unwrap();
        assert_eq!(
            readings,
            [
                GpuReading {
                    index: "0".into(),
                    uuid: "GPU-aaaa".into(),
                    util: 94,
                    memory_util: 77
                },
                GpuReading {
                    index: "1".into(),
                    uuid: "GPU-bbbb".into(),
                    util: 0,
                    memory_util: 0
                },
            ]
        );
        assert!(parse_readings("0, GPU-a, 5\n").is_err());
        let labels: BTreeMap<String, String> = [(LABEL_GPUS.to_owned(), "0,3".to_owned())].into();
        assert_eq!(devices_of(&labels), ["0", "3"]);
    }
}
