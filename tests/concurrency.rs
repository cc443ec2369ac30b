//! Reads that miss the cache reach the storage service together: a queue depth
//! above one at the application (fio with libaio, direct I/O) becomes as many
//! requests in flight, on the raw disk file and through the loop device. The proxy
//! in front of Azurite stops answering while the reads are issued and counts the
//! requests waiting on it, so the test sees concurrency, not timings.

mod common;
mod faultproxy;

use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use common::azurite::Azurite;
use common::bd::Harness;
use common::mount::require_root;
use faultproxy::{Config, Proxy};

/// Reads issued at once by one fio job.
const DEPTH: usize = 32;

const BD: Harness = Harness::new("concurrency-run");

/// A 64 MiB drive full of data (so no read is a hole), written straight to Azurite.
fn written_drive(tag: &str) -> String {
    let spec = BD.new_drive(tag, "64MiB");
    let mp = BD.mp();
    BD.mount(&spec, &mp, &["--mode", "raw"]);
    common::util::sh_ok(&format!(
        "dd if=/dev/urandom of={} bs=1M count=64 conv=notrunc,fsync status=none",
        mp.disk()
    ));
    BD.unmount(&mp);
    spec
}

/// fio reading DEPTH 4 KiB blocks, each in a different 64 KiB cache block, all
/// submitted at once with libaio and direct I/O.
fn spawn_fio(target: &str) -> Child {
    Command::new("fio")
        .args([
            "--name=qd",
            &format!("--filename={target}"),
            "--rw=randread",
            "--blockalign=64k",
            "--randseed=7",
            "--bs=4k",
            "--size=64M",
            "--direct=1",
            "--ioengine=libaio",
            &format!("--iodepth={DEPTH}"),
            &format!("--iodepth_batch_submit={DEPTH}"),
            &format!("--number_ios={DEPTH}"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("fio (scripts/install-deps.sh installs it)")
}

/// Pauses the proxy, runs fio against `target`, and returns the most requests
/// that were waiting on the proxy at once before it let them go.
fn most_in_flight(proxy: &Proxy, target: &str) -> u64 {
    proxy.paused.store(true, Relaxed);
    let fio = spawn_fio(target);
    let start = Instant::now();
    let mut most = 0;
    // Until every read waits, or long enough that more will not come.
    while start.elapsed() < Duration::from_secs(15) && most < DEPTH as u64 {
        most = most.max(proxy.waiting.load(Relaxed));
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    most = most.max(proxy.waiting.load(Relaxed));
    proxy.paused.store(false, Relaxed);
    let out = fio.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "fio: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    most
}

#[test]
fn reads_at_queue_depth_32_are_in_flight_together_on_the_raw_file_and_the_loop_device() {
    require_root();
    let spec = written_drive("qd");
    let proxy = Proxy::start(Config::clean(Azurite::shared().port));
    let cs = proxy.connection_string();
    let through = |args: &[&str]| BD.cmd(args).cs(&cs).ok();

    let mp = BD.mp_through(&cs);
    through(&["mount", &spec, mp.s(), "--mode", "raw"]);
    let raw = most_in_flight(&proxy, &mp.disk());
    through(&["unmount", mp.s()]);

    let dev = through(&["mount", &spec, mp.s(), "--mode", "block"]);
    let dev = dev.lines().last().unwrap().trim().to_string();
    let block = most_in_flight(&proxy, &dev);
    through(&["unmount", mp.s()]);

    eprintln!(
        "most requests in flight at queue depth {DEPTH}: raw file {raw}, loop device {block}"
    );
    // Before, four FUSE threads each waited on one fetch, the kernel sent direct
    // reads one at a time, and the loop device read its file one request at a time.
    assert!(
        raw >= DEPTH as u64 * 3 / 4 && block >= DEPTH as u64 * 3 / 4,
        "most requests in flight at queue depth {DEPTH}: raw file {raw}, loop device {block}"
    );
}
