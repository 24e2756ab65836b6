"""A stand-in for the EC2 instance metadata service at 169.254.169.254, run in
one host's network namespace, answering what Metaflow's spot termination
monitor asks (``metaflow/plugins/kubernetes/spot_monitor_sidecar.py``):

- ``PUT /latest/api/token``: an IMDSv2 token;
- ``GET /latest/meta-data/instance-life-cycle``: ``spot``;
- ``GET /latest/meta-data/spot/termination-time``: 404 until the test writes
  the termination time into TRIGGER_FILE, then 200 with that time, as EC2
  answers once the two-minute warning is given.

    python fake_imds.py TRIGGER_FILE READY_FILE
"""

import http.server
import os
import sys

TRIGGER, READY = sys.argv[1], sys.argv[2]


class Handler(http.server.BaseHTTPRequestHandler):
    def _answer(self, code: int, text: str = "") -> None:
        body = text.encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_PUT(self):  # noqa: N802 (http.server's names)
        self._answer(200, "fake-token") if self.path == "/latest/api/token" else self._answer(404)

    def do_GET(self):  # noqa: N802
        if self.path == "/latest/meta-data/instance-life-cycle":
            self._answer(200, "spot")
        elif self.path == "/latest/meta-data/spot/termination-time" and os.path.exists(TRIGGER):
            with open(TRIGGER) as f:
                self._answer(200, f.read().strip())
        else:
            self._answer(404)

    def log_message(self, fmt, *args):
        sys.stderr.write("fake-imds: " + fmt % args + "\n")


server = http.server.HTTPServer(("169.254.169.254", 80), Handler)
open(READY, "w").close()
server.serve_forever()
