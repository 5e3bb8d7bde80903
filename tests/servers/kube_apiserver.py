#!/usr/bin/env python3
"""A small Kubernetes API server for leaderrun's tests: coordination.k8s.io/v1 Leases only.

No real API server can be had on the test machines, so this one follows the rules the real
one applies to Leases, as the API conventions and the apiserver's source state them
(staging/src/k8s.io/apiserver/pkg/registry/generic/registry/store.go and
pkg/registry/coordination/lease/strategy.go):

- one resourceVersion sequence (integer strings, like etcd's revision) bumped by every
  write to any object, kept across restarts;
- POST creates (409 AlreadyExists when the name is taken); uid and creationTimestamp are
  set by the server;
- PUT replaces: 422 Invalid without metadata.resourceVersion (leases allow no
  unconditional update), 409 Conflict on a stale one; a PUT to a missing Lease creates it
  (201: create-on-update is allowed) unless the body carries metadata.uid, which then
  fails storage's uid precondition (409 Conflict);
- DELETE answers 200 with the deleted object; 404 NotFound Status for a missing one;
- watch (?watch=true|1) streams ADDED / MODIFIED / DELETED events after the given
  resourceVersion, chunked, one JSON object per line; a resourceVersion older than the
  kept history (the last HISTORY events) gets an ERROR event carrying a 410 Gone Status,
  inside an HTTP 200 stream, as the real server sends it;
- bearer tokens: none or an unknown one is 401; the --denied-token is authenticated but
  RBAC denies it everything on leases (403, naming verb and resource);
- every response has a Date header (the core reads the server's clock from it);
- discovery enough for kubectl: /version, /api, /apis, /apis/coordination.k8s.io/v1,
  /openapi/v3 (/openapi/v2 is 404: kubectl then validates nothing).

For the tests only: the number of API requests served so far, by verb ({"get": 3,
"watch": 1, ...}), is in STATE_DIR/requests.json and at GET /_test/requests
(unauthenticated).

State lives in STATE_DIR/state.json, written (atomically) on every mutation. Standard
library only.
"""

import argparse
import copy
import datetime
import json
import os
import re
import ssl
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

GROUP = "coordination.k8s.io"
VERSION = "v1"
HISTORY = 1000  # events kept for watches (--history)
SPEC_FIELDS = (
    "holderIdentity",
    "leaseDurationSeconds",
    "acquireTime",
    "renewTime",
    "leaseTransitions",
    "strategy",
    "preferredHolder",
)
MICRO_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|[+-]\d\d:\d\d)$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LEASES_PATH = re.compile(
    r"^/apis/coordination\.k8s\.io/v1(?:/namespaces/(?P<ns>[^/]+))?/leases(?:/(?P<name>[^/]+))?$"
)


def now_rfc3339():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def status(code, reason, message, name=None):
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if name is not None:
        body["details"] = {"name": name, "group": GROUP, "kind": "leases"}
    return body


def qualified(name):
    return 'leases.%s "%s"' % (GROUP, name)


class ApiError(Exception):
    def __init__(self, code, reason, message, name=None):
        super().__init__(message)
        self.code = code
        self.body = status(code, reason, message, name)


def not_found(name):
    return ApiError(404, "NotFound", "%s not found" % qualified(name), name)


def conflict(name, why):
    message = "Operation cannot be fulfilled on %s: %s" % (qualified(name), why)
    return ApiError(409, "Conflict", message, name)


def invalid(name, field, value, why):
    message = '%s is invalid: %s: Invalid value: %s: %s' % (
        "Lease.coordination.k8s.io \"%s\"" % name,
        field,
        json.dumps(value),
        why,
    )
    err = ApiError(422, "Invalid", message, name)
    err.body["details"]["kind"] = "Lease"
    err.body["details"]["causes"] = [{"reason": "FieldValueInvalid", "message": why, "field": field}]
    return err


def bad_request(message):
    return ApiError(400, "BadRequest", message)


class Store:
    """Every Lease, the resourceVersion sequence and the recent events, behind one lock."""

    def __init__(self, path, history):
        self.path = path
        self.history = history
        self.cond = threading.Condition()
        self.rv = 0
        self.objects = {}  # "namespace/name" -> Lease
        self.events = []  # [rv, type, Lease], oldest first
        self.history_floor = 0  # events at or below this resourceVersion are forgotten
        self.requests = {}
        if os.path.exists(path):
            with open(path) as f:
                saved = json.load(f)
            self.rv = saved["rv"]
            self.objects = saved["objects"]
            self.events = saved["events"]
            self.history_floor = saved["history_floor"]
            self.requests = saved.get("requests", {})

    def count(self, verb):
        """Count a request; the counts are also in requests.json, for tests to read."""
        with self.cond:
            self.requests[verb] = self.requests.get(verb, 0) + 1
            tmp = os.path.join(os.path.dirname(self.path), "requests.json.tmp")
            with open(tmp, "w") as f:
                json.dump(self.requests, f)
            os.replace(tmp, os.path.join(os.path.dirname(self.path), "requests.json"))

    def save(self):
        state = {
            "rv": self.rv,
            "objects": self.objects,
            "events": self.events,
            "history_floor": self.history_floor,
            "requests": self.requests,
        }
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(state, f)
        os.replace(tmp, self.path)

    def record(self, kind, obj):
        """Bump the resourceVersion onto obj, keep the event, persist, wake watchers."""
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.events.append([self.rv, kind, copy.deepcopy(obj)])
        if len(self.events) > self.history:
            dropped = self.events[: len(self.events) - self.history]
            self.events = self.events[len(self.events) - self.history :]
            self.history_floor = dropped[-1][0]
        self.save()
        self.cond.notify_all()

    def get(self, ns, name):
        with self.cond:
            obj = self.objects.get(ns + "/" + name)
            if obj is None:
                raise not_found(name)
            return copy.deepcopy(obj)

    def list(self, ns, name_filter):
        with self.cond:
            items = [
                copy.deepcopy(obj)
                for key, obj in sorted(self.objects.items())
                if (ns is None or key.split("/", 1)[0] == ns)
                and (name_filter is None or obj["metadata"]["name"] == name_filter)
            ]
            return items, str(self.rv)

    def create(self, ns, body, name_in_path=None):
        with self.cond:
            return self._create(ns, body, name_in_path)

    def _create(self, ns, body, name_in_path):
        obj = clean(ns, body, name_in_path)
        name = obj["metadata"]["name"]
        key = ns + "/" + name
        if key in self.objects:
            raise ApiError(409, "AlreadyExists", "%s already exists" % qualified(name), name)
        obj["metadata"]["uid"] = str(uuid.uuid4())
        obj["metadata"]["creationTimestamp"] = now_rfc3339()
        self.objects[key] = obj
        self.record("ADDED", obj)
        return copy.deepcopy(obj)

    def replace(self, ns, name, body):
        """(created, object)"""
        with self.cond:
            meta = body.get("metadata") or {}
            key = ns + "/" + name
            existing = self.objects.get(key)
            if existing is None:
                # Create-on-update: storage checks only the uid precondition.
                if meta.get("uid"):
                    raise conflict(
                        name,
                        "Precondition failed: UID in precondition: %s, UID in object meta: " % meta["uid"],
                    )
                return True, self._create(ns, body, name)
            rv = meta.get("resourceVersion")
            if not rv:
                raise invalid(name, "metadata.resourceVersion", 0, "must be specified for an update")
            if meta.get("uid") and meta["uid"] != existing["metadata"]["uid"]:
                raise conflict(
                    name,
                    "Precondition failed: UID in precondition: %s, UID in object meta: %s"
                    % (meta["uid"], existing["metadata"]["uid"]),
                )
            if rv != existing["metadata"]["resourceVersion"]:
                raise conflict(
                    name,
                    "the object has been modified; please apply your changes to the latest version and try again",
                )
            obj = clean(ns, body, name)
            for kept in ("uid", "creationTimestamp"):
                obj["metadata"][kept] = existing["metadata"][kept]
            self.objects[key] = obj
            self.record("MODIFIED", obj)
            return False, copy.deepcopy(obj)

    def patch(self, ns, name, patch):
        """A JSON merge patch (a strategic merge patch is treated as one: a Lease has no lists)."""
        with self.cond:
            key = ns + "/" + name
            existing = self.objects.get(key)
            if existing is None:
                raise not_found(name)
            wanted_rv = (patch.get("metadata") or {}).get("resourceVersion")
            if wanted_rv and wanted_rv != existing["metadata"]["resourceVersion"]:
                raise conflict(
                    name,
                    "the object has been modified; please apply your changes to the latest version and try again",
                )
            merged = merge_patch(copy.deepcopy(existing), patch)
            obj = clean(ns, merged, name)
            for kept in ("uid", "creationTimestamp"):
                obj["metadata"][kept] = existing["metadata"][kept]
            self.objects[key] = obj
            self.record("MODIFIED", obj)
            return copy.deepcopy(obj)

    def delete(self, ns, name):
        with self.cond:
            key = ns + "/" + name
            obj = self.objects.pop(key, None)
            if obj is None:
                raise not_found(name)
            self.record("DELETED", obj)
            return copy.deepcopy(obj)


def merge_patch(target, patch):
    if not isinstance(patch, dict):
        return patch
    if not isinstance(target, dict):
        target = {}
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        else:
            target[key] = merge_patch(target.get(key), value)
    return target


def clean(ns, body, name_in_path):
    """The Lease as the server stores it: known fields only, checked as validation does."""
    if not isinstance(body, dict):
        raise bad_request("the body is not a JSON object")
    if body.get("kind") not in (None, "Lease") or body.get("apiVersion") not in (None, GROUP + "/" + VERSION):
        raise bad_request("the body is a %s %s, not a Lease" % (body.get("apiVersion"), body.get("kind")))
    meta = body.get("metadata") or {}
    name = meta.get("name") or name_in_path
    if not name:
        raise invalid("", "metadata.name", "", "name or generateName is required")
    if name_in_path is not None and name != name_in_path:
        raise bad_request("the name of the object (%s) does not match the name on the URL (%s)" % (name, name_in_path))
    if len(name) > 253 or not DNS_SUBDOMAIN.match(name):
        raise invalid(name, "metadata.name", name, "a lowercase RFC 1123 subdomain must consist of lower case "
                      "alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character")
    if meta.get("namespace") not in (None, "", ns):
        raise bad_request("the namespace of the object (%s) does not match the namespace on the request (%s)"
                          % (meta.get("namespace"), ns))
    out_meta = {"name": name, "namespace": ns}
    for field in ("labels", "annotations"):
        value = meta.get(field)
        if value is None:
            continue
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise bad_request("metadata.%s must map strings to strings" % field)
        if value:
            out_meta[field] = dict(value)
    spec_in = body.get("spec") or {}
    spec = {k: spec_in[k] for k in SPEC_FIELDS if spec_in.get(k) is not None}
    for field in ("acquireTime", "renewTime"):
        if field in spec and not (isinstance(spec[field], str) and MICRO_TIME.match(spec[field])):
            raise bad_request('Lease in version "v1" cannot be handled as a Lease: parsing time %s as '
                              '"2006-01-02T15:04:05.000000Z07:00": cannot parse' % json.dumps(spec[field]))
    for field in ("leaseDurationSeconds", "leaseTransitions"):
        if field in spec and (not isinstance(spec[field], int) or isinstance(spec[field], bool)):
            raise bad_request("spec.%s must be an integer" % field)
    if spec.get("leaseDurationSeconds", 1) <= 0:
        raise invalid(name, "spec.leaseDurationSeconds", spec["leaseDurationSeconds"], "must be greater than 0")
    if spec.get("leaseTransitions", 0) < 0:
        raise invalid(name, "spec.leaseTransitions", spec["leaseTransitions"], "must be greater than or equal to 0")
    return {"kind": "Lease", "apiVersion": GROUP + "/" + VERSION, "metadata": out_meta, "spec": spec}


DISCOVERY = {
    "/version": {
        "major": "1",
        "minor": "32",
        "gitVersion": "v1.32.0-leaderrun-test",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.23",
        "compiler": "gc",
        "platform": "linux/amd64",
    },
    "/api": {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}],
    },
    "/api/v1": {"kind": "APIResourceList", "groupVersion": "v1", "resources": []},
    "/apis": {
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [
            {
                "name": GROUP,
                "versions": [{"groupVersion": GROUP + "/" + VERSION, "version": VERSION}],
                "preferredVersion": {"groupVersion": GROUP + "/" + VERSION, "version": VERSION},
            }
        ],
    },
    "/apis/coordination.k8s.io": {
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": GROUP,
        "versions": [{"groupVersion": GROUP + "/" + VERSION, "version": VERSION}],
        "preferredVersion": {"groupVersion": GROUP + "/" + VERSION, "version": VERSION},
    },
    "/apis/coordination.k8s.io/v1": {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": GROUP + "/" + VERSION,
        "resources": [
            {
                "name": "leases",
                "singularName": "lease",
                "namespaced": True,
                "kind": "Lease",
                "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
            }
        ],
    },
    "/openapi/v3": {"paths": {}},
}
NAMESPACE_PATH = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)$")


class Server(ThreadingHTTPServer):
    # socketserver's default backlog of 5 drops the SYNs of many clients connecting at once.
    request_queue_size = 256
    daemon_threads = True


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes: without TCP_NODELAY the body waits for
    # the client's delayed ACK (about 40 ms a request), which is this server's cost, not
    # the client's.
    disable_nagle_algorithm = True
    server_version = "leaderrun-test-apiserver"

    def setup(self):
        # The TLS handshake runs here, in the request's thread, so that a slow or stopped
        # client never blocks the accepting thread.
        self.request.settimeout(30)
        try:
            self.request.do_handshake()
            self.handshake_failed = False
        except (ssl.SSLError, OSError):
            self.handshake_failed = True
        self.request.settimeout(None)
        super().setup()

    def handle(self):
        if self.handshake_failed:
            return
        try:
            super().handle()
        except (ssl.SSLError, ConnectionError, TimeoutError, OSError):
            self.close_connection = True

    def log_message(self, fmt, *args):
        if self.server.verbose:
            sys.stderr.write("%s %s\n" % (self.log_date_time_string(), fmt % args))

    # -- responses --

    def send_json(self, code, body, content_type="application/json"):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def send_error_status(self, err):
        self.send_json(err.code, err.body)

    def read_body(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not raw:
            return {}
        try:
            return json.loads(raw)
        except ValueError as e:
            raise bad_request("the body is not JSON: %s" % e)

    # -- authentication and authorization --

    def authenticate(self):
        """The user name, or None after answering 401."""
        header = self.headers.get("Authorization") or ""
        token = header[len("Bearer "):] if header.startswith("Bearer ") else None
        if token is not None and token == self.server.token:
            return "system:serviceaccount:default:leaderrun"
        if token is not None and token == self.server.denied_token:
            return "system:serviceaccount:default:denied"
        self.send_json(401, status(401, "Unauthorized", "Unauthorized"))
        return None

    def authorize(self, user, verb, ns, name):
        if user != "system:serviceaccount:default:denied":
            return True
        what = qualified(name) if name else "leases.%s" % GROUP
        where = ' in the namespace "%s"' % ns if ns else " at the cluster scope"
        message = '%s is forbidden: User "%s" cannot %s resource "leases" in API group "%s"%s' % (
            what, user, verb, GROUP, where)
        err = ApiError(403, "Forbidden", message, name or "")
        self.send_error_status(err)
        return False

    # -- dispatch --

    def do_GET(self):
        self.handle_api("GET")

    def do_POST(self):
        self.handle_api("POST")

    def do_PUT(self):
        self.handle_api("PUT")

    def do_PATCH(self):
        self.handle_api("PATCH")

    def do_DELETE(self):
        self.handle_api("DELETE")

    def handle_api(self, method):
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        path = url.path.rstrip("/") or "/"
        if path == "/_test/requests" and method == "GET":
            with self.server.store.cond:
                counts = dict(self.server.store.requests)
            return self.send_json(200, counts)
        # The body must be read even when the request is refused, or the connection is garbled.
        try:
            body = self.read_body()
        except ApiError as err:
            return self.send_error_status(err)
        user = self.authenticate()
        if user is None:
            return
        if method == "GET" and path in DISCOVERY:
            return self.send_json(200, DISCOVERY[path])
        namespace = NAMESPACE_PATH.match(path)
        if method == "GET" and namespace:
            # Every namespace exists (kubectl asks after a 404, to word its message).
            return self.send_json(200, {"kind": "Namespace", "apiVersion": "v1",
                                        "metadata": {"name": namespace.group("ns")}, "status": {"phase": "Active"}})
        match = LEASES_PATH.match(path)
        if not match:
            return self.send_json(404, status(404, "NotFound", "the server could not find the requested resource"))
        ns, name = match.group("ns"), match.group("name")
        watching = query.get("watch", "") in ("true", "1")
        verb = {
            "GET": "watch" if watching else ("get" if name else "list"),
            "POST": "create",
            "PUT": "update",
            "PATCH": "patch",
            "DELETE": "delete",
        }[method]
        self.server.store.count(verb)
        if not self.authorize(user, verb, ns, name):
            return
        if ns is None and verb not in ("list", "watch"):
            return self.send_json(404, status(404, "NotFound", "the server could not find the requested resource"))
        try:
            if verb == "watch":
                return self.watch(ns, name, query)
            if verb == "get":
                return self.send_json(200, self.server.store.get(ns, name))
            if verb == "list":
                return self.send_list(ns, query)
            if verb == "create":
                if name:
                    return self.send_json(405, status(405, "MethodNotAllowed", "POST to a named Lease"))
                return self.send_json(201, self.server.store.create(ns, body))
            if verb == "update":
                created, obj = self.server.store.replace(ns, name, body)
                return self.send_json(201 if created else 200, obj)
            if verb == "patch":
                return self.send_json(200, self.server.store.patch(ns, name, body))
            if verb == "delete":
                return self.send_json(200, self.server.store.delete(ns, name))
        except ApiError as err:
            return self.send_error_status(err)

    def name_filter(self, query):
        selector = query.get("fieldSelector")
        if not selector:
            return None
        for term in selector.split(","):
            key, _, value = term.partition("=")
            if key == "metadata.name":
                return value.lstrip("=")
        raise bad_request('"%s" is not a known field selector: only "metadata.name"' % selector)

    def send_list(self, ns, query):
        items, rv = self.server.store.list(ns, self.name_filter(query))
        self.send_json(
            200,
            {
                "kind": "LeaseList",
                "apiVersion": GROUP + "/" + VERSION,
                "metadata": {"resourceVersion": rv},
                "items": items,
            },
        )

    def watch(self, ns, name, query):
        store = self.server.store
        only = name or self.name_filter(query)
        timeout = float(query.get("timeoutSeconds") or 1800)
        deadline = time.monotonic() + timeout
        since = query.get("resourceVersion", "")

        def matches(obj):
            meta = obj["metadata"]
            return (ns is None or meta["namespace"] == ns) and (only is None or meta["name"] == only)

        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()

        def send(event):
            data = (json.dumps(event) + "\n").encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        try:
            with store.cond:
                if since in ("", "0"):
                    # No resourceVersion: the current state as ADDED events, then changes.
                    initial = [copy.deepcopy(o) for _, o in sorted(store.objects.items()) if matches(o)]
                    position = store.rv
                else:
                    try:
                        position = int(since)
                    except ValueError:
                        position = -1
                    initial = []
                    if position < store.history_floor or position < 0:
                        gone = status(410, "Expired", "too old resource version: %s (%d)" % (since, store.history_floor + 1))
                        send({"type": "ERROR", "object": gone})
                        self.wfile.write(b"0\r\n\r\n")
                        return
            for obj in initial:
                send({"type": "ADDED", "object": obj})
            while True:
                with store.cond:
                    pending = [(rv, kind, obj) for rv, kind, obj in store.events if rv > position]
                    if not pending:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            break
                        store.cond.wait(min(left, 1.0))
                        continue
                    position = pending[-1][0]
                for _, kind, obj in pending:
                    if matches(obj):
                        send({"type": kind, "object": copy.deepcopy(obj)})
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError, OSError):
            self.close_connection = True


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--token-file", required=True, help="a file: the allowed token, then the denied token")
    parser.add_argument("--history", type=int, default=HISTORY, help="events kept for watches")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()

    with open(args.token_file) as f:
        tokens = f.read().split()
    server = Server(("127.0.0.1", args.port), Handler)
    server.token, server.denied_token = tokens[0], tokens[1]
    server.verbose = args.verbose
    server.store = Store(os.path.join(args.state_dir, "state.json"), args.history)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(args.cert, args.key)
    context.set_alpn_protocols(["http/1.1"])
    server.socket = context.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
    sys.stderr.write("listening on 127.0.0.1:%d\n" % args.port)
    sys.stderr.flush()
    server.serve_forever()


if __name__ == "__main__":
    main()
