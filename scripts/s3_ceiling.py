"""The S3 emulator's own ceiling, measured like blobdrive's backend ceiling:
parallel PUTs and GETs of objects of s3backer's block size. Prints one JSON object.

usage: s3_ceiling.py ENDPOINT BUCKET MIB BLOCK_MIB
"""
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import boto3

endpoint, bucket, mib, block_mib = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="bench",
                  aws_secret_access_key="bench", region_name="us-east-1")
data = bytes((i * 31) % 251 for i in range(block_mib << 20))
n = mib // block_mib


def put(i):
    s3.put_object(Bucket=bucket, Key=f"ceiling/{i}", Body=data)


def get(i):
    s3.get_object(Bucket=bucket, Key=f"ceiling/{i}")["Body"].read()


with ThreadPoolExecutor(8) as pool:
    t = time.monotonic()
    list(pool.map(put, range(n)))
    put_s = time.monotonic() - t
    t = time.monotonic()
    list(pool.map(get, range(n)))
    get_s = time.monotonic() - t
print(json.dumps({"put_mib_s": mib / put_s, "put_requests_s": n / put_s,
                  "get_mib_s": mib / get_s, "get_requests_s": n / get_s}))
