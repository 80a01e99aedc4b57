"""A git smart-HTTP server over TLS that requires credentials (Basic, or the password as a Bearer
token), for the clone-with-credentials test: `git http-backend` (CGI) behind Python's http.server.

argv: PROJECT_ROOT CERT KEY PORT_FILE SEEN_FILE. The expected `user:password` comes in the
environment (CLONE_AUTH), never in argv. On every request, before answering, every process's
/proc/<pid>/cmdline is read: each one that names git is written to SEEN_FILE as
`git <cmdline>`, and each one holding the password (or its Basic token) as `LEAK <cmdline>`.
"""
import base64
import http.server
import os
import ssl
import subprocess
import sys

root, cert, key, port_file, seen_file = sys.argv[1:6]
auth = os.environ["CLONE_AUTH"]
password = auth.split(":", 1)[1]
token = base64.b64encode(auth.encode()).decode()
# Basic with the pair, or the password alone as a Bearer token.
accepted = {"Basic " + token, "Bearer " + password}


def scan():
    lines = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if password in cmd or token in cmd:
            lines.append(f"LEAK {pid} {cmd}")
        elif cmd.startswith("git") or "/git" in cmd.split(" ")[0]:
            lines.append(f"git {pid} {cmd}")
    with open(seen_file, "a") as f:
        for line in lines:
            f.write(line + "\n")


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.serve()

    def do_POST(self):
        self.serve()

    def log_message(self, *args):
        pass

    def body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                chunk = self.rfile.read(size + 2)
                if size == 0:
                    return out
                out += chunk[:-2]
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def serve(self):
        scan()
        body = self.body()
        if self.headers.get("Authorization") not in accepted:
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="git"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        path, _, query = self.path.partition("?")
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "GIT_PROJECT_ROOT": root,
            "GIT_HTTP_EXPORT_ALL": "1",
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": "/dev/null",
            "REQUEST_METHOD": self.command,
            "PATH_INFO": path,
            "QUERY_STRING": query,
            "CONTENT_TYPE": self.headers.get("Content-Type", ""),
            "CONTENT_LENGTH": str(len(body)),
            "HTTP_CONTENT_ENCODING": self.headers.get("Content-Encoding", ""),
            "GIT_PROTOCOL": self.headers.get("Git-Protocol", ""),
            "REMOTE_USER": auth.split(":", 1)[0],
            "REMOTE_ADDR": self.client_address[0],
        }
        out = subprocess.run(
            ["git", "http-backend"], input=body, env=env, capture_output=True
        ).stdout
        sep = b"\r\n\r\n" if b"\r\n\r\n" in out else b"\n\n"
        head, _, payload = out.partition(sep)
        status, headers = 200, []
        for line in head.replace(b"\r\n", b"\n").split(b"\n"):
            name, _, value = line.decode().partition(":")
            if name.lower() == "status":
                status = int(value.split()[0])
            elif name:
                headers.append((name, value.strip()))
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
server.socket = ctx.wrap_socket(server.socket, server_side=True)
with open(port_file + ".tmp", "w") as f:
    f.write(str(server.server_address[1]))
os.rename(port_file + ".tmp", port_file)
server.serve_forever()
