//! How many compute threads the server may use: the CPUs this process may run
//! on (its affinity, which a cgroup cpuset or `taskset` narrows) and the CPU time
//! its cgroup may take (a quota of `q` µs per period of `p` µs is `⌈q/p⌉` CPUs),
//! whichever is smaller — not the host's core count, which in a container can be
//! many times what the container gets.

use std::fs;
use std::path::{Path, PathBuf};

/// The CPUs found, and what limited them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cpus {
    /// Threads to run compute on (at least 1).
    pub threads: usize,
    /// Where the number came from, for the start-up line.
    pub source: String,
}

/// The CPUs this process may use, read from `/proc/self/status` and the cgroup
/// files (v2's `cpu.max`, v1's `cpu.cfs_quota_us` / `cpu.cfs_period_us`);
/// `std::thread::available_parallelism` where neither can be read.
pub fn available() -> Cpus {
    let affinity = fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| allowed_cpus(&s));
    let quota = fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|s| quota_cpus(&s, Path::new("/sys/fs/cgroup")));
    combine(affinity, quota)
}

/// The smaller of the two limits, and its name.
fn combine(affinity: Option<usize>, quota: Option<usize>) -> Cpus {
    match (affinity, quota) {
        (Some(a), Some(q)) if q < a => Cpus {
            threads: q,
            source: format!("cgroup CPU quota ({a} CPUs in the affinity mask)"),
        },
        (Some(a), _) => Cpus {
            threads: a,
            source: "CPU affinity (cpuset)".into(),
        },
        (None, Some(q)) => Cpus {
            threads: q,
            source: "cgroup CPU quota".into(),
        },
        (None, None) => Cpus {
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            source: "available parallelism".into(),
        },
    }
}

/// The count of `Cpus_allowed_list` (`0-3,8,10-11`) in `/proc/self/status`.
fn allowed_cpus(status: &str) -> Option<usize> {
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?
        .trim();
    let mut count = 0;
    for part in list.split(',').filter(|p| !p.is_empty()) {
        count += match part.split_once('-') {
            Some((a, b)) => b.trim().parse::<usize>().ok()? + 1 - a.trim().parse::<usize>().ok()?,
            None => {
                part.trim().parse::<usize>().ok()?;
                1
            }
        };
    }
    (count > 0).then_some(count)
}

/// `⌈quota / period⌉` of the process's cgroup, `None` without a quota. `cgroup`
/// is `/proc/self/cgroup`; `root` is where the hierarchies are mounted.
fn quota_cpus(cgroup: &str, root: &Path) -> Option<usize> {
    for line in cgroup.lines() {
        let mut fields = line.splitn(3, ':');
        let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        let path = path.trim_start_matches('/');
        if controllers.is_empty() {
            // cgroup v2: "max 100000" or "200000 100000" in cpu.max.
            let dir = [root.join(path), root.join("unified").join(path)]
                .into_iter()
                .find(|d| d.join("cpu.max").is_file());
            if let Some(max) = dir.and_then(|d| fs::read_to_string(d.join("cpu.max")).ok()) {
                let mut it = max.split_whitespace();
                let (quota, period) = (it.next()?, it.next()?);
                if let (Ok(q), Ok(p)) = (quota.parse::<u64>(), period.parse::<u64>()) {
                    return Some(ceil_cpus(q, p));
                }
            }
        } else if controllers.split(',').any(|c| c == "cpu") {
            let dir: PathBuf = [
                root.join(controllers).join(path),
                root.join("cpu").join(path),
            ]
            .into_iter()
            .find(|d| d.join("cpu.cfs_quota_us").is_file())?;
            let read = |name: &str| -> Option<i64> {
                fs::read_to_string(dir.join(name)).ok()?.trim().parse().ok()
            };
            let (q, p) = (read("cpu.cfs_quota_us")?, read("cpu.cfs_period_us")?);
            if q > 0 && p > 0 {
                return Some(ceil_cpus(q as u64, p as u64));
            }
        }
    }
    None
}

fn ceil_cpus(quota: u64, period: u64) -> usize {
    (quota.div_ceil(period.max(1)) as usize).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_affinity_list_is_counted() {
        let status = "Name:\tattend\nCpus_allowed:\tff\nCpus_allowed_list:\t0-3,8,10-11\n";
        assert_eq!(allowed_cpus(status), Some(7));
        assert_eq!(allowed_cpus("Cpus_allowed_list:\t5\n"), Some(1));
        assert_eq!(allowed_cpus("Name:\tx\n"), None);
        assert_eq!(allowed_cpus("Cpus_allowed_list:\tgarbage\n"), None);
    }

    #[test]
    fn a_cgroup_quota_caps_the_threads_and_says_so() {
        let root = std::env::temp_dir().join(format!("attend-cpus-{}", std::process::id()));
        let v2 = root.join("job");
        fs::create_dir_all(&v2).unwrap();
        fs::write(v2.join("cpu.max"), "150000 100000\n").unwrap();
        assert_eq!(quota_cpus("0::/job\n", &root), Some(2));
        fs::write(v2.join("cpu.max"), "max 100000\n").unwrap();
        assert_eq!(quota_cpus("0::/job\n", &root), None);
        let v1 = root.join("cpu,cpuacct").join("job");
        fs::create_dir_all(&v1).unwrap();
        fs::write(v1.join("cpu.cfs_quota_us"), "50000\n").unwrap();
        fs::write(v1.join("cpu.cfs_period_us"), "100000\n").unwrap();
        assert_eq!(quota_cpus("3:cpu,cpuacct:/job\n", &root), Some(1));
        fs::write(v1.join("cpu.cfs_quota_us"), "-1\n").unwrap();
        assert_eq!(quota_cpus("3:cpu,cpuacct:/job\n", &root), None);
        fs::remove_dir_all(&root).unwrap();

        let capped = combine(Some(8), Some(2));
        assert_eq!(capped.threads, 2);
        assert!(capped.source.contains("quota"), "{}", capped.source);
        assert_eq!(combine(Some(2), Some(4)).threads, 2);
        assert_eq!(combine(None, Some(3)).threads, 3);
    }
}
