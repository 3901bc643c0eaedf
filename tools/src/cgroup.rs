//! How often the kernel froze this process's cgroup for its CPU quota
//! (CFS bandwidth control: cgroup v2 `cpu.max`, v1 `cpu.cfs_quota_us`).
//!
//! A gateway in such a cgroup is stopped whenever the cgroup has used its
//! quota for the period, for up to the rest of the period (tens of
//! milliseconds), and a pacing sender cannot send what it would have sent
//! meanwhile: `soya demo --rate auto` reads these counters around its
//! calibration and leaves the runs more headroom when they moved
//! (`demo_circuit::run_rate`). A cpuset (whole cores) never throttles.

use std::path::{Path, PathBuf};

/// The cgroup directories whose `cpu.stat` may count throttling for this
/// process: its own cgroup and every ancestor (a quota set on a parent
/// throttles the children), for cgroup v2 and for v1's `cpu` controller.
fn cpu_stat_dirs(proc_self_cgroup: &str, root: &Path) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for line in proc_self_cgroup.lines() {
        // "hierarchy-ID:controller-list:path"
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let mounts: Vec<PathBuf> = if controllers.is_empty() {
            vec![root.to_path_buf()]
        } else if controllers.split(',').any(|c| c == "cpu") {
            vec![
                root.join(controllers),
                root.join("cpu"),
                root.join("cpu,cpuacct"),
            ]
        } else {
            continue;
        };
        for mount in mounts {
            let mut p = Path::new(path.trim());
            loop {
                let rel = p.strip_prefix("/").unwrap_or(p);
                let dir = mount.join(rel);
                if !dirs.contains(&dir) {
                    dirs.push(dir);
                }
                match p.parent() {
                    Some(parent) => p = parent,
                    None => break,
                }
            }
        }
    }
    dirs
}

/// `nr_throttled` of a `cpu.stat` (v1 and v2 both have it).
fn nr_throttled(cpu_stat: &str) -> Option<u64> {
    cpu_stat.lines().find_map(|l| {
        let mut w = l.split_whitespace();
        (w.next() == Some("nr_throttled"))
            .then(|| w.next().and_then(|v| v.parse().ok()))
            .flatten()
    })
}

/// Periods in which the kernel throttled this process's cgroup or one of
/// its ancestors, summed; `None` when no `cpu.stat` could be read (no
/// cgroup file system, or no CPU controller).
pub fn throttled_periods() -> Option<u64> {
    let me = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let mut total = None;
    for dir in cpu_stat_dirs(&me, Path::new("/sys/fs/cgroup")) {
        if let Some(n) = std::fs::read_to_string(dir.join("cpu.stat"))
            .ok()
            .as_deref()
            .and_then(nr_throttled)
        {
            *total.get_or_insert(0) += n;
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_nr_throttled_from_v1_and_v2_cpu_stat() {
        let v2 = "usage_usec 100\nuser_usec 60\nsystem_usec 40\nnr_periods 50\n\
                  nr_throttled 7\nthrottled_usec 9000\n";
        assert_eq!(nr_throttled(v2), Some(7));
        let v1 = "nr_periods 12\nnr_throttled 3\nthrottled_time 1000\n";
        assert_eq!(nr_throttled(v1), Some(3));
        assert_eq!(nr_throttled("usage_usec 1\n"), None);
    }

    #[test]
    fn looks_in_the_cgroup_and_its_ancestors() {
        let root = Path::new("/cg");
        let v2 = cpu_stat_dirs("0::/a/b\n", root);
        assert_eq!(
            v2,
            [Path::new("/cg/a/b"), Path::new("/cg/a"), Path::new("/cg")]
        );
        let v1 = cpu_stat_dirs("4:memory:/m\n1:cpu:/demo\n2:cpuacct:/\n0::/\n", root);
        assert!(v1.contains(&PathBuf::from("/cg/cpu/demo")), "{v1:?}");
        assert!(v1.contains(&PathBuf::from("/cg/cpu")), "{v1:?}");
        assert!(
            !v1.iter().any(|d| d.ends_with("m")),
            "memory is not cpu: {v1:?}"
        );
        let joint = cpu_stat_dirs("3:cpu,cpuacct:/x\n", root);
        assert!(
            joint.contains(&PathBuf::from("/cg/cpu,cpuacct/x")),
            "{joint:?}"
        );
    }
}
