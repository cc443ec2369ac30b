"""Prints a benchmark run's figures next to their ceilings and the targets, and
fails (exit 1) if any expected figure is missing: the quick run in CI checks that
the whole pipeline still produces every number, not how fast it is. With
`--partial` (a run of some parts: bench.sh --only), only what the run measured is
shown, and the targets whose figures it has."""
import sys

from bench_results import Results

res = Results(sys.argv[1])
r = res.r

EXPECTED = [
    "backend_ceiling.put_mib_s", "backend_ceiling.get_mib_s", "backend_ceiling.put_requests_s",
    "backend_ceiling.get_requests_s", "backend_ceiling.small_put_requests_s",
    "backend_ceiling.crc64_cpu_s_per_gib",
    "local.seq_write_mib_s", "local.seq_read_cold_mib_s", "local.seq_read_warm_mib_s",
    "local.rand_write_iops", "local.rand_read_iops",
    "blobdrive_fs.seq_write_mib_s", "blobdrive_fs.seq_write_put_page_calls",
    "blobdrive_fs.seq_read_cold_mib_s", "blobdrive_fs.seq_read_warm_mib_s",
    "blobdrive_fs.rand_write_iops", "blobdrive_fs.rand_write_put_page_calls_per_mib",
    "blobdrive_fs.rand_read_iops", "blobdrive_fs.peak_mib", "blobdrive_fs.cache_mib",
    "blobdrive_raw.seq_write_mib_s", "blobdrive_raw.seq_read_cold_mib_s",
    "blobdrive_tera.mount_s", "blobdrive_tera.first_byte_s", "blobdrive_tera.page_range_calls",
    "s3_ceiling.put_mib_s", "s3_ceiling.get_mib_s",
    "sdk.put_mib_s", "sdk.get_mib_s", "sdk.put_cpu_s_per_gib", "sdk.get_cpu_s_per_gib",
    "blobdrive_fs.seq_write_cpu_s_per_gib", "blobdrive_fs.seq_read_cold_cpu_s_per_gib",
    "blobdrive_fs.seq_read_warm_cpu_s_per_gib",
    "blobdrive_raw.seq_write_cpu_s_per_gib", "blobdrive_raw.seq_read_cold_cpu_s_per_gib",
    "s3backer.seq_write_mib_s", "s3backer.seq_read_cold_mib_s", "s3backer.seq_read_warm_mib_s",
    "s3backer.rand_write_iops", "s3backer.rand_read_iops", "s3backer.peak_mib",
    "blobdrive_fs_encrypted.seq_write_mib_s", "blobdrive_fs_encrypted.seq_read_cold_mib_s",
    "blobdrive_fs_encrypted.seq_write_cpu_s_per_gib", "blobdrive_fs_encrypted.seq_read_cold_cpu_s_per_gib",
]

get = res.get
g = res.g
partial = "--partial" in sys.argv[2:]
missing = res.missing(EXPECTED)
frac = lambda a, b: (g(a) / g(b)) if g(b) else 0.0
# has(*keys): whether the run measured every one (always, for a whole run: a
# missing figure then shows as 0 and fails the run below).
has = lambda *keys: not partial or not res.missing([k for k in keys if k])

print(f"machine: {r.get('machine')}")
print()
print(f"{'figure':<44} {'value':>12} {'ceiling':>12} {'fraction':>9}")
rows = [
    ("blobdrive fs seq write MiB/s", "blobdrive_fs.seq_write_mib_s", "backend_ceiling.put_mib_s"),
    ("blobdrive raw seq write MiB/s", "blobdrive_raw.seq_write_mib_s", "backend_ceiling.put_mib_s"),
    ("blobdrive fs seq read cold MiB/s", "blobdrive_fs.seq_read_cold_mib_s", "backend_ceiling.get_mib_s"),
    ("blobdrive raw seq read cold MiB/s", "blobdrive_raw.seq_read_cold_mib_s", "backend_ceiling.get_mib_s"),
    ("blobdrive fs seq read warm MiB/s", "blobdrive_fs.seq_read_warm_mib_s", "local.seq_read_warm_mib_s"),
    ("encrypted fs seq write MiB/s (of plain fs)", "blobdrive_fs_encrypted.seq_write_mib_s", "blobdrive_fs.seq_write_mib_s"),
    ("encrypted fs seq read cold MiB/s (of plain)", "blobdrive_fs_encrypted.seq_read_cold_mib_s", "blobdrive_fs.seq_read_cold_mib_s"),
    ("blobdrive fs rand write IOPS", "blobdrive_fs.rand_write_iops", "backend_ceiling.small_put_requests_s"),
    ("blobdrive fs rand read IOPS", "blobdrive_fs.rand_read_iops", "local.rand_read_iops"),
    ("local seq write MiB/s", "local.seq_write_mib_s", None),
    ("local seq read cold MiB/s", "local.seq_read_cold_mib_s", None),
    ("s3backer seq write MiB/s", "s3backer.seq_write_mib_s", "s3_ceiling.put_mib_s"),
    ("s3backer seq read cold MiB/s", "s3backer.seq_read_cold_mib_s", "s3_ceiling.get_mib_s"),
    ("s3backer rand write IOPS", "s3backer.rand_write_iops", None),
    ("s3backer rand read IOPS", "s3backer.rand_read_iops", None),
]
for name, k, c in rows:
    if not has(k, c):
        continue
    v = g(k)
    if c:
        print(f"{name:<44} {v:>12.1f} {g(c):>12.1f} {frac(k, c):>9.2f}")
    else:
        print(f"{name:<44} {v:>12.1f} {'':>12} {'':>9}")
print()
# CPU per GiB moved: the daemon's (user + system, from /proc) for each sequential
# job, the SDK process's for its own run; MiB/s beside each, and the share of the
# SDK's speed through the same emulator.
print(f"{'sequential job':<44} {'MiB/s':>9} {'CPU s/GiB':>10} {'vs SDK':>7}")
cpu_rows = [
    ("blobdrive fs write (daemon)", "blobdrive_fs.seq_write_mib_s", "blobdrive_fs.seq_write_cpu_s_per_gib", "sdk.put_mib_s"),
    ("blobdrive fs cold read (daemon)", "blobdrive_fs.seq_read_cold_mib_s", "blobdrive_fs.seq_read_cold_cpu_s_per_gib", "sdk.get_mib_s"),
    ("blobdrive fs warm read (daemon)", "blobdrive_fs.seq_read_warm_mib_s", "blobdrive_fs.seq_read_warm_cpu_s_per_gib", None),
    ("encrypted fs write (daemon)", "blobdrive_fs_encrypted.seq_write_mib_s", "blobdrive_fs_encrypted.seq_write_cpu_s_per_gib", "sdk.put_mib_s"),
    ("encrypted fs cold read (daemon)", "blobdrive_fs_encrypted.seq_read_cold_mib_s", "blobdrive_fs_encrypted.seq_read_cold_cpu_s_per_gib", "sdk.get_mib_s"),
    ("blobdrive raw write, 1 MiB requests (daemon)", "blobdrive_raw.seq_write_mib_s", "blobdrive_raw.seq_write_cpu_s_per_gib", "sdk.put_mib_s"),
    ("blobdrive raw cold read, 1 MiB (daemon)", "blobdrive_raw.seq_read_cold_mib_s", "blobdrive_raw.seq_read_cold_cpu_s_per_gib", "sdk.get_mib_s"),
    ("Python SDK Put Page, 8 x 4 MiB", "sdk.put_mib_s", "sdk.put_cpu_s_per_gib", None),
    ("Python SDK ranged Get, 8 x 4 MiB", "sdk.get_mib_s", "sdk.get_cpu_s_per_gib", None),
]
for name, k, cpu, sdk in cpu_rows:
    if not has(k, cpu):
        continue
    sdk = sdk if has(sdk) else None
    vs = f"{frac(k, sdk):>7.2f}" if sdk else f"{'':>7}"
    print(f"{name:<44} {g(k):>9.1f} {g(cpu):>10.3f} {vs}")
# Part of the daemon's figures above: Azure's CRC64 of every Put Page body and of
# every ranged read of at most 4 MiB (the end-to-end check), alone, from memory.
print(f"{'Azure CRC64, 4 MiB pieces in memory':<44} {'':>9} {g('backend_ceiling.crc64_cpu_s_per_gib'):>10.3f}")
print()
# The sequential jobs and the random ones run on mounts of their own: the daemon's
# peak is the highest of the three readings.
fs_peak = max(g("blobdrive_fs.peak_mib_after_seq_write"), g("blobdrive_fs.peak_mib_after_seq_read"),
              g("blobdrive_fs.peak_mib"))
targets = [
    ("seq write >= 80% of the Put Page ceiling", frac("blobdrive_fs.seq_write_mib_s", "backend_ceiling.put_mib_s") >= 0.8),
    ("cold seq read >= 80% of the ranged-read ceiling", frac("blobdrive_fs.seq_read_cold_mib_s", "backend_ceiling.get_mib_s") >= 0.8),
    ("rand write <= 1.5 Put Page calls per MiB", 0 < g("blobdrive_fs.rand_write_put_page_calls_per_mib") <= 1.5),
    ("rand write IOPS many times the 4 KiB Put Page rate", frac("blobdrive_fs.rand_write_iops", "backend_ceiling.small_put_requests_s") >= 3),
    ("1 TiB sparse mount < 2 s", 0 < g("blobdrive_tera.mount_s") < 2),
    ("daemon CPU <= 0.8 s/GiB, ext4 seq write", 0 < g("blobdrive_fs.seq_write_cpu_s_per_gib") <= 0.8),
    ("daemon CPU <= 0.8 s/GiB, ext4 cold seq read", 0 < g("blobdrive_fs.seq_read_cold_cpu_s_per_gib") <= 0.8),
    ("daemon CPU <= 1.0 s/GiB, raw seq write (1 MiB)", 0 < g("blobdrive_raw.seq_write_cpu_s_per_gib") <= 1.0),
    ("daemon CPU <= 1.0 s/GiB, raw cold seq read (1 MiB)", 0 < g("blobdrive_raw.seq_read_cold_cpu_s_per_gib") <= 1.0),
    ("ext4 seq write >= 1.0x the Python SDK", frac("blobdrive_fs.seq_write_mib_s", "sdk.put_mib_s") >= 1.0),
    ("ext4 cold seq read >= 1.0x the Python SDK", frac("blobdrive_fs.seq_read_cold_mib_s", "sdk.get_mib_s") >= 1.0),
    ("daemon peak <= cache + 100 MiB", 0 < fs_peak <= g("blobdrive_fs.cache_mib") + 100),
    ("encrypted ext4 seq write >= 0.8 of the plain one", frac("blobdrive_fs_encrypted.seq_write_mib_s", "blobdrive_fs.seq_write_mib_s") >= 0.8),
    ("encrypted ext4 cold seq read >= 0.8 of the plain one", frac("blobdrive_fs_encrypted.seq_read_cold_mib_s", "blobdrive_fs.seq_read_cold_mib_s") >= 0.8),
    ("seq write fraction above s3backer's", frac("blobdrive_fs.seq_write_mib_s", "backend_ceiling.put_mib_s") > frac("s3backer.seq_write_mib_s", "s3_ceiling.put_mib_s")),
    ("cold read fraction above s3backer's", frac("blobdrive_fs.seq_read_cold_mib_s", "backend_ceiling.get_mib_s") > frac("s3backer.seq_read_cold_mib_s", "s3_ceiling.get_mib_s")),
]
# The figures each target is judged on, by the words of its name.
needs = {
    "seq write >= 80%": ["blobdrive_fs.seq_write_mib_s", "backend_ceiling.put_mib_s"],
    "cold seq read >= 80%": ["blobdrive_fs.seq_read_cold_mib_s", "backend_ceiling.get_mib_s"],
    "rand write <= 1.5": ["blobdrive_fs.rand_write_put_page_calls_per_mib"],
    "rand write IOPS": ["blobdrive_fs.rand_write_iops", "backend_ceiling.small_put_requests_s"],
    "1 TiB": ["blobdrive_tera.mount_s"],
    "daemon CPU <= 0.8 s/GiB, ext4 seq write": ["blobdrive_fs.seq_write_cpu_s_per_gib"],
    "daemon CPU <= 0.8 s/GiB, ext4 cold": ["blobdrive_fs.seq_read_cold_cpu_s_per_gib"],
    "daemon CPU <= 1.0 s/GiB, raw seq write": ["blobdrive_raw.seq_write_cpu_s_per_gib"],
    "daemon CPU <= 1.0 s/GiB, raw cold": ["blobdrive_raw.seq_read_cold_cpu_s_per_gib"],
    "ext4 seq write >= 1.0x": ["blobdrive_fs.seq_write_mib_s", "sdk.put_mib_s"],
    "ext4 cold seq read >= 1.0x": ["blobdrive_fs.seq_read_cold_mib_s", "sdk.get_mib_s"],
    "daemon peak": ["blobdrive_fs.peak_mib", "blobdrive_fs.cache_mib"],
    "encrypted ext4 seq write": ["blobdrive_fs_encrypted.seq_write_mib_s", "blobdrive_fs.seq_write_mib_s"],
    "encrypted ext4 cold": ["blobdrive_fs_encrypted.seq_read_cold_mib_s", "blobdrive_fs.seq_read_cold_mib_s"],
    "seq write fraction": ["blobdrive_fs.seq_write_mib_s", "s3backer.seq_write_mib_s"],
    "cold read fraction": ["blobdrive_fs.seq_read_cold_mib_s", "s3backer.seq_read_cold_mib_s"],
}
for name, met in targets:
    keys = next(v for k, v in needs.items() if name.startswith(k))
    if has(*keys):
        print(f"  [{'met' if met else 'MISSED'}] {name}")
if partial:
    sys.exit(0)
print(f"  1 TiB mount: {g('blobdrive_tera.mount_s'):.3f} s with {get('blobdrive_tera.page_range_calls')} Get Page Ranges calls; first byte {g('blobdrive_tera.first_byte_s') * 1000:.1f} ms")
print(f"  seq write: {get('blobdrive_fs.seq_write_put_page_calls')} Put Page calls; rand write: {g('blobdrive_fs.rand_write_put_page_calls_per_mib'):.3f} calls per MiB, {g('blobdrive_fs.rand_write_uploaded_mib'):.0f} MiB uploaded")
print(f"  peak memory: blobdrive {fs_peak:.0f} MiB (cache {g('blobdrive_fs.cache_mib'):.0f} MiB), s3backer {g('s3backer.peak_mib'):.0f} MiB")
if missing:
    print(f"MISSING FIGURES: {missing}", file=sys.stderr)
    sys.exit(1)
