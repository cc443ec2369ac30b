"""Prints a WAN-profile benchmark run (scripts/bench-wan.sh) next to its ceilings and
the targets of issue 14, and fails (exit 1) if any expected figure is missing
(unless `--partial`: a run of some parts only). CI's quick run checks that every
figure is produced, not how fast it is."""
import sys

from bench_results import Results

res = Results(sys.argv[1])
r = res.r

EXPECTED = [
    "machine.rtt_ms",
    "wan_ceiling.put_mib_s", "wan_ceiling.get_mib_s",
    "wan_fs_ceiling.put_mib_s", "wan_fs_ceiling.get_mib_s",
    "wan_ceiling.rand_read_4k_qd1_s", "wan_ceiling.rand_read_4k_qd32_s",
    "wan_ceiling.rand_read_64k_qd32_s",
    "wan_raw.rand_read_qd1_iops", "wan_raw.rand_read_qd32_iops", "wan_raw.miss_fraction",
    "wan_raw.write_fsync_ms",
    "wan_block.rand_read_qd1_iops", "wan_block.rand_read_qd32_iops", "wan_block.loop_direct_io",
    "wan_fs.seq_write_mib_s", "wan_fs.seq_read_cold_mib_s",
    "wan_fs.rand_read_qd1_iops", "wan_fs.rand_read_qd32_iops",
    "wan_fs.write_fsync_ms", "wan_fs.requests_per_fsync", "wan_fs.put_pages_per_fsync",
    "wan_caps.cap_mib_s", "wan_caps.cap_requests_s",
    "wan_caps.seq_write_mib_s", "wan_caps.seq_write_requests", "wan_caps.seq_write_refused_503",
    "wan_caps.rand_read_qd32_iops", "wan_caps.rand_read_requests",
    "wan_caps.rand_read_refused_503", "wan_caps.rand_read_seconds",
    "wan_dc.seq_read_cold_mib_s", "wan_dc.seq_read_warm_mib_s", "wan_dc.local_seq_read_mib_s",
    "wan_dc.seq_read_warm_from_service_mib", "wan_dc.seq_mib", "wan_dc.warm_start",
    "wan_dc.rand_read_qd32_cold_iops", "wan_dc.rand_read_qd32_warm_iops",
    "wan_dc.daemon_hwm_mib", "wan_dc.cache_size_mib", "wan_dc.seq_read_memory_mib_s",
]

get = res.get
g = res.g
missing = res.missing(EXPECTED)
rtt = g("machine.rtt_ms")
# What 32 requests in flight can carry: the backend's own figure at 32 in flight,
# or 32 per round trip, whichever is lower.
qd32_ceiling = min(g("wan_ceiling.rand_read_4k_qd32_s"), 32 * 1000 / rtt if rtt else 0)
frac = lambda v, c: v / c if c else 0.0
# The sequential jobs through ext4 are measured against the ceiling taken after
# them on the same emulator (runs before it had only the fresh one); the cold read
# against the better of reading a fresh blob and reading the drive's own blob.
seq_put = g("wan_fs_ceiling.put_mib_s") or g("wan_ceiling.put_mib_s")
seq_get = (max(g("wan_fs_ceiling.get_mib_s"), g("wan_fs_ceiling.blob_get_mib_s"))
           or g("wan_ceiling.get_mib_s"))
# Under the request cap what counts is the requests the service served per second
# (fio's IOPS also counts reads answered from the cache).
capped_read_rate = frac(g("wan_caps.rand_read_requests"), g("wan_caps.rand_read_seconds"))

print(f"machine: {r.get('machine')}")
print()
print(f"{'figure':<48} {'value':>10} {'ceiling':>10} {'fraction':>9}")
rows = [
    ("raw random 4 KiB read QD 32, IOPS", "wan_raw.rand_read_qd32_iops", qd32_ceiling),
    ("block random 4 KiB read QD 32, IOPS", "wan_block.rand_read_qd32_iops", qd32_ceiling),
    ("fs random 4 KiB read QD 32, IOPS", "wan_fs.rand_read_qd32_iops", qd32_ceiling),
    ("raw random 4 KiB read QD 1, IOPS", "wan_raw.rand_read_qd1_iops", g("wan_ceiling.rand_read_4k_qd1_s")),
    ("block random 4 KiB read QD 1, IOPS", "wan_block.rand_read_qd1_iops", g("wan_ceiling.rand_read_4k_qd1_s")),
    ("fs random 4 KiB read QD 1, IOPS", "wan_fs.rand_read_qd1_iops", g("wan_ceiling.rand_read_4k_qd1_s")),
    ("fs sequential write, MiB/s", "wan_fs.seq_write_mib_s", seq_put),
    ("fs sequential read cold, MiB/s", "wan_fs.seq_read_cold_mib_s", seq_get),
    ("capped raw sequential write, MiB/s", "wan_caps.seq_write_mib_s", g("wan_caps.cap_mib_s")),
    ("capped raw random read QD 32, requests served/s", capped_read_rate, g("wan_caps.cap_requests_s")),
    ("disk cache: warm fs sequential read, MiB/s (ceiling: the local disk)", "wan_dc.seq_read_warm_mib_s",
     g("wan_dc.local_seq_read_mib_s")),
    ("disk cache: warm fs random 4 KiB QD 32, IOPS (against cold)", "wan_dc.rand_read_qd32_warm_iops",
     g("wan_dc.rand_read_qd32_cold_iops")),
]
for name, k, c in rows:
    if not isinstance(k, float) and get(k) is None:
        continue  # a part this run left out (--only)
    v = k if isinstance(k, float) else g(k)
    print(f"{name:<48} {v:>10.1f} {c:>10.1f} {frac(v, c):>9.2f}")
print(f"  (the 64 KiB ranged-read ceiling at 32 in flight, what a cache miss fetches: "
      f"{g('wan_ceiling.rand_read_64k_qd32_s'):.0f}/s; share of reads that missed the cache: "
      f"raw {g('wan_raw.miss_fraction'):.2f}, block {g('wan_block.miss_fraction'):.2f})")
print(f"  (8 x 4 MiB Put Page / 8 x {g('wan_ceiling.get_bytes_per_request') / 2**20:.0f} MiB ranged reads: "
      f"{g('wan_ceiling.put_mib_s'):.0f} / {g('wan_ceiling.get_mib_s'):.0f} MiB/s "
      f"on a fresh emulator, {g('wan_fs_ceiling.put_mib_s'):.0f} / {g('wan_fs_ceiling.get_mib_s'):.0f} "
      f"on the ext4 jobs' emulator after them, where reading the drive's own blob ran "
      f"{g('wan_fs_ceiling.blob_get_mib_s'):.0f})")
def cpu(key):
    c = r.get("wan_fs", {}).get(key) if key != "ceiling" else r.get("wan_fs_ceiling", {}).get("cpu")
    if not c:
        return "not measured"
    return (f"cores {c['busy_share']:.0%} busy; CPU s: azurite {c.get('azurite_cpu_s', 0)}, "
            f"proxy {c.get('proxy_cpu_s', 0)}" + (f", daemon {c['daemon_cpu_s']}" if "daemon_cpu_s" in c else ""))
def per_gib(key):
    c = r.get("wan_fs", {}).get(key) or {}
    mib = g("wan_fs.seq_mib")
    return f"{c['daemon_cpu_s'] / (mib / 1024):.2f}" if "daemon_cpu_s" in c and mib else "not measured"
print(f"  disk cache: the same read from the daemon's memory {g('wan_dc.seq_read_memory_mib_s'):.1f} MiB/s "
      f"(the disk cache's warm read is {frac(g('wan_dc.seq_read_warm_mib_s'), g('wan_dc.seq_read_memory_mib_s')):.2f} of it)")
print(f"  disk cache: cold sequential read {g('wan_dc.seq_read_cold_mib_s'):.1f} MiB/s; warm remount "
      f"(started warm: {get('wan_dc.warm_start')}) read {g('wan_dc.seq_read_warm_from_service_mib'):.1f} of "
      f"{g('wan_dc.seq_mib'):.0f} MiB from the service; {get('wan_dc.held_after_cold_mib')} MiB held; "
      f"daemon peak {g('wan_dc.daemon_hwm_mib'):.0f} MiB with a {g('wan_dc.cache_size_mib'):.0f} MiB memory cache")
print(f"  daemon CPU s per GiB: fs sequential write {per_gib('seq_write_cpu')}, "
      f"fs cold read {per_gib('seq_read_cold_cpu')}")
print(f"  CPU during the fs sequential write: {cpu('seq_write_cpu')}")
print(f"  CPU during the fs sequential cold read: {cpu('seq_read_cold_cpu')}")
print(f"  CPU during that ceiling (put + get): {cpu('ceiling')}")
print()
ratio = lambda a, b: g(a) / g(b) if g(b) else 0.0
capped = lambda ref, bad: g(bad) / g(ref) if g(ref) else 0.0
# Each target with the parts of the run it needs (a run of some parts only leaves
# the others unmeasured).
targets = [
    ("raw QD 32 >= 0.8 x min(backend at 32, 32/RTT)", ["wan_ceiling", "wan_raw"],
     frac(g("wan_raw.rand_read_qd32_iops"), qd32_ceiling) >= 0.8),
    ("block QD 32 >= 0.6 x that", ["wan_ceiling", "wan_block"],
     frac(g("wan_block.rand_read_qd32_iops"), qd32_ceiling) >= 0.6),
    ("fs QD 32 >= 0.6 x that", ["wan_ceiling", "wan_fs"],
     frac(g("wan_fs.rand_read_qd32_iops"), qd32_ceiling) >= 0.6),
    ("QD 32 >= 8 x QD 1 on raw", ["wan_raw"],
     ratio("wan_raw.rand_read_qd32_iops", "wan_raw.rand_read_qd1_iops") >= 8),
    ("QD 32 >= 8 x QD 1 on block", ["wan_block"],
     ratio("wan_block.rand_read_qd32_iops", "wan_block.rand_read_qd1_iops") >= 8),
    ("QD 32 >= 8 x QD 1 on fs", ["wan_fs"],
     ratio("wan_fs.rand_read_qd32_iops", "wan_fs.rand_read_qd1_iops") >= 8),
    ("fs sequential write >= 0.8 of the Put Page ceiling", ["wan_fs"],
     frac(g("wan_fs.seq_write_mib_s"), seq_put) >= 0.8),
    ("fs sequential cold read >= 0.8 of the ranged-read ceiling", ["wan_fs"],
     frac(g("wan_fs.seq_read_cold_mib_s"), seq_get) >= 0.8),
    ("raw 4 KiB write + fsync <= 2 RTT", ["wan_raw"],
     0 < g("wan_raw.write_fsync_ms") <= 2 * rtt),
    ("capped sequential write >= 0.9 of the MiB/s cap", ["wan_caps"],
     ratio("wan_caps.seq_write_mib_s", "wan_caps.cap_mib_s") >= 0.9),
    ("capped random reads >= 0.9 of the request cap", ["wan_caps"],
     frac(capped_read_rate, g("wan_caps.cap_requests_s")) >= 0.9),
    ("disk cache: a warm remount reads <= 5% of the file from the service", ["wan_dc"],
     get("wan_dc.warm_start") is True and g("wan_dc.seq_mib") > 0
     and g("wan_dc.seq_read_warm_from_service_mib") <= 0.05 * g("wan_dc.seq_mib")),
    ("disk cache: warm sequential read >= 0.8 of the local disk's", ["wan_dc"],
     frac(g("wan_dc.seq_read_warm_mib_s"), g("wan_dc.local_seq_read_mib_s")) >= 0.8),
    ("disk cache: warm random 4 KiB QD 32 >= 10 x cold", ["wan_dc"],
     ratio("wan_dc.rand_read_qd32_warm_iops", "wan_dc.rand_read_qd32_cold_iops") >= 10),
    ("disk cache: daemon memory <= --cache-size + 150 MiB", ["wan_dc"],
     0 < g("wan_dc.daemon_hwm_mib") <= g("wan_dc.cache_size_mib") + 150),
    ("no request storm: at most one 503 per 4 requests served, both capped jobs", ["wan_caps"],
     capped("wan_caps.seq_write_requests", "wan_caps.seq_write_refused_503") <= 0.25
     and capped("wan_caps.rand_read_requests", "wan_caps.rand_read_refused_503") <= 0.25),
]
for name, needs, met in targets:
    state = "met" if met else "MISSED"
    if any(r.get(part) is None for part in needs):
        state = "not measured"
    print(f"  [{state}] {name}")
print(f"  write + fsync: raw {g('wan_raw.write_fsync_ms'):.1f} ms ({g('wan_raw.write_fsync_ms') / rtt if rtt else 0:.2f} RTT); "
      f"ext4 {g('wan_fs.write_fsync_ms'):.1f} ms ({g('wan_fs.write_fsync_ms') / rtt if rtt else 0:.2f} RTT), "
      f"{g('wan_fs.requests_per_fsync'):.2f} requests and {g('wan_fs.put_pages_per_fsync'):.2f} Put Page calls per fsync")
print(f"  caps: sequential write {get('wan_caps.seq_write_requests')} requests served, "
      f"{get('wan_caps.seq_write_refused_503')} answered 503; random reads {get('wan_caps.rand_read_requests')} served, "
      f"{get('wan_caps.rand_read_refused_503')} answered 503")
if missing and "--partial" not in sys.argv[2:]:
    print(f"MISSING FIGURES: {missing}", file=sys.stderr)
    sys.exit(1)
