"""Prepares a fresh moto_server (started with INITIAL_NO_AUTH_ACTION_COUNT=3) for tests.

The first three requests are unauthenticated: create an IAM user, give it an allow-all
policy, create its access key. Then, signed with that key, create the buckets named on the
command line. Prints "ACCESS_KEY_ID SECRET_ACCESS_KEY" on stdout.

Usage: python3 s3_moto_setup.py ENDPOINT BUCKET...
"""
import json
import sys

import boto3

endpoint = sys.argv[1]
iam = boto3.client("iam", endpoint_url=endpoint, region_name="us-east-1",
                   aws_access_key_id="setup", aws_secret_access_key="setup")
iam.create_user(UserName="shardpoint")
iam.put_user_policy(UserName="shardpoint", PolicyName="allow-all", PolicyDocument=json.dumps(
    {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
key = iam.create_access_key(UserName="shardpoint")["AccessKey"]
s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                  aws_access_key_id=key["AccessKeyId"], aws_secret_access_key=key["SecretAccessKey"])
for bucket in sys.argv[2:]:
    s3.create_bucket(Bucket=bucket)
print(key["AccessKeyId"], key["SecretAccessKey"])
