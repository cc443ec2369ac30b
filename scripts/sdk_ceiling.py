"""What Microsoft's Python SDK for Blob Storage moves through the same emulator:
a page blob written with 8 parallel 4 MiB Put Page calls from memory, then read
back with 8 parallel 4 MiB ranged Gets (the SDK's own chunk size for downloads,
and what blobdrive's daemon sent before its read-ahead runs grew to 16 MiB).
Prints one JSON object: MiB/s each way, and the CPU seconds this process spent
per GiB moved (user + system), to set beside the daemon's.

usage: sdk_ceiling.py CONNECTION_STRING CONTAINER MIB
"""
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from azure.storage.blob import BlobServiceClient

conn, container, mib = sys.argv[1], sys.argv[2], int(sys.argv[3])
RUN = 4 << 20
n = (mib << 20) // RUN
svc = BlobServiceClient.from_connection_string(conn)
try:
    svc.create_container(container)
except Exception:  # already there
    pass
blob = svc.get_blob_client(container, "sdk-ceiling.vhd")
blob.create_page_blob(size=n * RUN)
data = bytes((i * 31) % 251 for i in range(RUN))


def put(i):
    blob.upload_page(data, offset=i * RUN, length=RUN)


def get(i):
    got = blob.download_blob(offset=i * RUN, length=RUN, max_concurrency=1).readall()
    assert len(got) == RUN


def timed(fn):
    cpu, t = os.times(), time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(fn, range(n)))
    wall = time.monotonic() - t
    after = os.times()
    cpu_s = (after.user - cpu.user) + (after.system - cpu.system)
    return (n * RUN / 2**20) / wall, cpu_s / (n * RUN / 2**30)


put_mib_s, put_cpu = timed(put)
get_mib_s, get_cpu = timed(get)
blob.delete_blob()
print(json.dumps({
    "put_mib_s": round(put_mib_s, 2), "put_cpu_s_per_gib": round(put_cpu, 3),
    "get_mib_s": round(get_mib_s, 2), "get_cpu_s_per_gib": round(get_cpu, 3),
}))
