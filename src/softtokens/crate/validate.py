"""A crate held to the Provenance Run Crate profile by the ecosystem's own validator (`rocrate-validator`, from the
roc-validator package), offline: the validator reads the RO-Crate 1.1 JSON-LD context over HTTP through its cache;
this serves the genuine 1.1 context (shipped here: ro-crate-py 0.13's copy, Apache-2.0) into a cache of its own, so a
node with no network validates as a laptop does. The 1.3 context ro-crate-py 0.16 ships maps ComputationalWorkflow
to another IRI and fails two checks wrongly: it is not the one a 1.1 crate names."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

CONTEXT_URL = "https://w3id.org/ro/crate/1.1/context"
CONTEXT_FILE = Path(__file__).with_name("ro-crate-1.1-context.jsonld")
PROFILE = "provenance-run-crate-0.5"


def seed_cache(cache_home: Path) -> Path:
    """The validator's HTTP cache under ``cache_home`` (its XDG_CACHE_HOME) holding the 1.1 context, as if fetched."""
    from requests.adapters import BaseAdapter, HTTPAdapter
    from requests_cache import CachedSession
    from urllib3.response import HTTPResponse

    body = CONTEXT_FILE.read_bytes()

    class Served(BaseAdapter):
        def send(self, request, **kwargs):
            raw = HTTPResponse(body=io.BytesIO(body), headers={"Content-Type": "application/ld+json"}, status=200,
                               preload_content=False, decode_content=False, request_url=request.url)
            return HTTPAdapter().build_response(request, raw)

        def close(self):
            pass

    where = Path(cache_home) / "rocrate-validator"
    where.mkdir(parents=True, exist_ok=True)
    session = CachedSession(cache_name=str(where / "http_cache"), backend="sqlite", expire_after=-1,
                            allowable_methods=("GET",), allowable_codes=(200, 302, 404))
    session.mount("https://w3id.org/", Served())
    if session.get(CONTEXT_URL).status_code != 200 or not session.cache.contains(url=CONTEXT_URL):
        raise RuntimeError(f"could not seed the validator's cache at {where}")
    return where


def validate(crate: Path, cache_home: Path) -> dict:
    """The validator's verdict on ``crate`` at PROFILE, offline: {"passed", "issues": [(severity, message, entity)]}."""
    from softtokens.crate.check import opened

    seed_cache(cache_home)
    exe = Path(sys.executable).with_name("rocrate-validator")
    # a zip unpacked first: rocrate-validator 0.13 stops on one ("Object of type URI is not JSON serializable")
    with opened(crate) as directory:
        proc = subprocess.run([str(exe), "validate", "--offline", "-p", PROFILE, "--no-paging", "--output-format",
                               "json", str(directory)], capture_output=True, text=True,
                              env={**os.environ, "XDG_CACHE_HOME": str(cache_home)})
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise RuntimeError(f"rocrate-validator gave no report (exit {proc.returncode}): {proc.stderr[-2000:]}") from None
    return {"passed": bool(report.get("passed")),
            "issues": [(i.get("severity"), i.get("message"), i.get("violatingEntity")) for i in report.get("issues", [])]}
