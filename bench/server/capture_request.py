"""What a client's first request weighs (docs/PERFORMANCE.md, "What the coding agents send"):
answers one POST with a 400, keeps its body, and prints its size, its system prompt's length,
its tools and the fields that shape the answer.

Usage: capture_request.py PORT OUT.json, then point the client at http://127.0.0.1:PORT
(e.g. ANTHROPIC_BASE_URL=http://127.0.0.1:PORT ANTHROPIC_API_KEY=k claude -p "Say hi")."""
import http.server
import json
import sys

port, out = int(sys.argv[1]), sys.argv[2]


class Keep(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        open(out, "wb").write(body)
        self.send_response(400)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"type":"error","error":{"type":"invalid_request_error","message":"captured"}}')

    def log_message(self, *args):
        pass


http.server.HTTPServer(("127.0.0.1", port), Keep).handle_request()
r = json.load(open(out))
system = r.get("system") or ""
system = system if isinstance(system, str) else "".join(b.get("text", "") for b in system)
tools = r.get("tools", [])
print(f"body {len(open(out, 'rb').read())} bytes, system {len(system)} characters, {len(tools)} tools "
      f"({len(json.dumps(tools))} characters of JSON): {[t.get('name') for t in tools]}; "
      f"max_tokens {r.get('max_tokens')}, thinking {r.get('thinking')}, stream {r.get('stream')}")
