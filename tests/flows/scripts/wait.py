"""A rank that reports no progress and waits ``--seconds`` (no torch): the
gang's straggler signals without progress reports have the call to look at."""

import argparse
import time

parser = argparse.ArgumentParser()
parser.add_argument("--seconds", type=float, default=10.0)
time.sleep(parser.parse_args().seconds)
