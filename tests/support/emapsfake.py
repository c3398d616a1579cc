"""A local stand-in for Electricity Maps' API: `/v3/carbon-intensity/latest`
answered in the service's own shape, for two zones (DE, FR), with its
`auth-token` header checked."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ElectricityMapsFake:
    """Answers `/v3/carbon-intensity/latest` as the service does; knows two zones."""

    def __init__(self, token: str, status: int = 200, at: str = "2026-11-28T17:00:00.000Z") -> None:
        self.token, self.status, self.seen, self.at = token, status, [], at
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                outer.seen.append((self.path, self.headers.get("auth-token")))
                zone = self.path.split("zone=")[-1]
                if outer.status != 200 or self.headers.get("auth-token") != outer.token:
                    return self._send(outer.status if outer.status != 200 else 401, {"error": "Access denied"})
                if zone not in ("DE", "FR"):
                    return self._send(404, {"status": "error", "message": f"Zone '{zone}' does not exist."})
                self._send(200, {"zone": zone, "carbonIntensity": 302 if zone == "DE" else 31,
                                 "datetime": outer.at, "updatedAt": "2026-11-28T17:41:05.000Z",
                                 "createdAt": "2026-11-25T17:44:07.771Z", "emissionFactorType": "lifecycle",
                                 "isEstimated": zone == "FR", "estimationMethod": None,
                                 "temporalGranularity": "hourly"})

            def _send(self, status, body):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v3"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
