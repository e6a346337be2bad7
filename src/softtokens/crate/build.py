"""`softtokens crate TARGET`: a result packed with everything it rests on as a Workflow Run RO-Crate (the Process,
Workflow and Provenance Run Crate profiles, 0.5), readable without this project: WorkflowHub and Zenodo take it in,
`rocrate-validator` checks it, `runcrate report` reads it, and `softtokens audit CRATE` (crate.check) holds every file
to the hash the crate names, wherever the crate was copied.

Made from the records the jobs wrote (crate.collect), never a second account: the workflow (its Snakefile and rules,
the package's version and commit) is the main ComputationalWorkflow and a HowTo whose steps are its rules, each with
its tool; every job of the chain a CreateAction (its tool as instrument, its inputs as object, its outputs as result,
its start and end, its settings, machine and libraries as PropertyValues), tied to its step by a ControlAction, and
Snakemake's run an OrganizeAction over them; every file with its size and sha256 at its path relative to the
workflow's root (so the records inside still resolve: the crate is the tree, moved); what a job read from outside
the workflow (a hub model at its revision, a packaged file, a local copy) as a leaf with its source and sha256.
A model's weights are named by their hash and left out unless --with-checkpoints (gigabytes on the paper grid)."""

from __future__ import annotations

import shutil
from pathlib import Path

from softtokens import __version__
from softtokens.crate.collect import Chain, chain_of, is_model, leaf_id, target_files
from softtokens.model.checkpoint import STATE_FILE
from softtokens.store.files import sha256_file
from softtokens.store.provenance import record_path

PROFILES = {p: f"https://w3id.org/ro/wfrun/{p}/0.5" for p in ("process", "workflow", "provenance")}
WORKFLOW_RO_CRATE = "https://w3id.org/workflowhub/workflow-ro-crate/1.0"
SHA256 = "https://w3id.org/ro/terms/workflow-run#sha256"   # the WRROC term (the 1.1 context has none)
WEIGHTS = ".safetensors"
NOT_INCLUDED = "not included: `softtokens crate --with-checkpoints` packs it"
CHECKOUT = Path(__file__).resolve().parents[3]   # the repository the package runs from (its Snakefile and rules)


def _project_metadata() -> tuple[str | None, list[str]]:
    """(license, authors) as the installed package's metadata says them (pyproject.toml), where it does."""
    from importlib.metadata import PackageNotFoundError, metadata

    try:
        meta = metadata("softtokens")
    except PackageNotFoundError:
        return None, []
    license_ = meta.get("License-Expression") or meta.get("License")
    authors = [a for a in (meta.get_all("Author") or []) + (meta.get_all("Author-email") or []) if a]
    return license_, authors


def _file_props(path: Path) -> dict:
    return {"contentSize": str(path.stat().st_size), "sha256": sha256_file(path)}


def _setting_values(crate, job_id: str, record: dict) -> list:
    """A job's settings, machine and library versions as PropertyValues (what it was given, where it ran)."""
    from rocrate.model.contextentity import ContextEntity

    values = {f"setting {k}": v for k, v in sorted((record.get("config") or {}).items())
              if isinstance(v, (str, int, float, bool))}
    device = record.get("device") or {}
    values.update({"device": f"{device.get('kind')} {device.get('name')} x{device.get('count')}",
                   "host": record.get("host"), "code": f"{record.get('git_commit')} (dirty: {record.get('git_dirty')})",
                   **{f"library {k}": v for k, v in (record.get("libraries") or {}).items() if v}})
    out = []
    for i, (name, value) in enumerate(values.items()):
        out.append(crate.add(ContextEntity(crate, f"{job_id}-pv-{i}", properties={
            "@type": "PropertyValue", "name": name, "value": str(value)})))
    return out


def _add_workflow(crate, stages: list[str], snakemake_version: str | None):
    from rocrate.model.contextentity import ContextEntity

    snakefile = CHECKOUT / "Snakefile"
    commit = next(iter(crate.softtokens_commits), None)
    workflow = crate.add_workflow(snakefile, dest_path="workflow/Snakefile", main=True, lang="snakemake",
                                  lang_version=snakemake_version, properties={
                                      "@type": ["File", "SoftwareSourceCode", "ComputationalWorkflow", "HowTo"],
                                      "name": "softtokens: Soft Tokens, Hard Truths as a Snakemake DAG",
                                      "version": __version__, **({"identifier": commit} if commit else {})})
    for rule in sorted((CHECKOUT / "workflow" / "rules").glob("*.smk")):
        # the workflow's source (the root's parts); its hasPart names the tools its steps run, each an action's
        crate.add_file(rule, dest_path=f"workflow/rules/{rule.name}", properties={
            "@type": ["File", "SoftwareSourceCode"], "name": f"the rules of {rule.stem}", **_file_props(rule)})
    steps, tools = {}, {}
    for i, stage in enumerate(stages):
        tools[stage] = crate.add(ContextEntity(crate, f"#tool-{stage}", properties={
            "@type": "SoftwareApplication", "name": f"softtokens ({stage})", "softwareVersion": __version__,
            "description": f"the {stage} jobs' command: python -m softtokens ..."}))
        steps[stage] = crate.add(ContextEntity(crate, f"#step-{stage}", properties={
            "@type": "HowToStep", "name": stage, "position": str(i), "workExample": {"@id": tools[stage].id}}))
        workflow.append_to("step", steps[stage])
        workflow.append_to("hasPart", tools[stage])   # the tools the workflow orchestrates
    return workflow, steps, tools


def leaf_properties(key: str, leaf: dict) -> dict:
    """What a job read from outside the workflow, in RO-Crate's terms: where from (a hub id at its revision, a pip
    package's file, a local path) and the sha256 of the bytes read."""
    kind = leaf.get("kind", "local")
    where = {"hub": f"the Hugging Face hub, {leaf.get('ref') or leaf.get('id')} at revision "
                    f"{leaf.get('revision') or 'unrecorded'}",
             "package": f"the pip package {leaf.get('distribution')} {leaf.get('version')}"}.get(kind, "a local copy")
    props = {"@type": "CreativeWork", "name": key, "description": f"read from outside the workflow: {where}",
             "identifier": str(leaf.get("path") or leaf.get("ref") or leaf.get("id") or key)}
    if leaf.get("sha256"):
        props["sha256"] = leaf["sha256"]
    if leaf.get("version"):
        props["version"] = str(leaf["version"])
    return props


def build_crate(targets: list[Path], with_checkpoints: bool = False):
    """The crate (a rocrate.ROCrate, not yet written) of ``targets`` and every file their records rest on."""
    from rocrate.model.contextentity import ContextEntity
    from rocrate.rocrate import ROCrate

    chain: Chain = chain_of(targets)
    crate = ROCrate(version="1.1", gen_preview=False)
    crate.metadata.extra_terms = {"sha256": SHA256}
    crate.softtokens_commits = sorted({r.get("git_commit") for r in chain.files.values() if r.get("git_commit")})
    crate.root_dataset["conformsTo"] = [crate.add(ContextEntity(crate, iri, properties={
        "@type": "CreativeWork", "name": f"{name.title()} Run Crate", "version": "0.5"})) for name, iri in PROFILES.items()
    ] + [crate.add(ContextEntity(crate, WORKFLOW_RO_CRATE, properties={
        "@type": "CreativeWork", "name": "Workflow RO-Crate", "version": "1.0"}))]
    license_, authors = _project_metadata()
    crate.root_dataset["name"] = f"softtokens results: {', '.join(sorted({t.name for t in targets}))}"
    crate.root_dataset["description"] = (
        "A result of the softtokens reproduction of 'Soft Tokens, Hard Truths' (Butt et al., 2025) with every file it "
        "rests on, each with its sha256, and the jobs that made them. Check it anywhere: softtokens audit THIS_CRATE.")
    crate.root_dataset["license"] = license_ or crate.add(ContextEntity(crate, "#license", properties={
        "@type": "CreativeWork", "name": "not stated", "description": "the project's metadata (pyproject.toml) states "
        "no license: set project.license there before publishing this crate"}))
    if authors:
        crate.root_dataset["author"] = [crate.add(ContextEntity(crate, f"#author-{i}", properties={
            "@type": "Person", "name": a})) for i, a in enumerate(authors)]
    records = list(chain.files.values())
    engine_version = next((r.get("libraries", {}).get("snakemake") for r in records if r.get("libraries")), None)
    stages = sorted({j.stage for j in chain.jobs.values()})
    workflow, steps, tools = _add_workflow(crate, stages, engine_version)
    entities = _add_files(crate, chain, with_checkpoints)
    leaves = {key: crate.add(ContextEntity(crate, key if key.startswith(("http", "#")) else f"#leaf:{key}",
                                           properties=leaf_properties(key, leaf)))
              for key, leaf in chain.leaves.items()}
    engine = crate.add(ContextEntity(crate, "#snakemake", properties={
        "@type": "SoftwareApplication", "name": "Snakemake", "softwareVersion": engine_version or "unknown",
        "url": "https://snakemake.readthedocs.io"}))
    controls, starts, ends = [], [], []
    for i, job in enumerate(sorted(chain.jobs.values(), key=lambda j: (j.record.get("started") or "", j.stage))):
        rec, job_id = job.record, f"#job-{i}"
        used = [entities[p] for p in job.inputs if p in entities]
        used += [leaves[leaf_id(leaf, name)] for name, leaf in (rec.get("external_inputs") or {}).items()
                 if isinstance(leaf, dict) and leaf_id(leaf, name) in leaves]
        action = crate.add_action(tools[job.stage], identifier=job_id, object=used + _setting_values(crate, job_id, rec),
                                  result=[entities[p] for p in job.results if p in entities],
                                  properties={"name": f"{job.stage}: {', '.join(job.results[:2])}"
                                              + (" ..." if len(job.results) > 2 else ""),
                                              "startTime": rec.get("started"), "endTime": rec.get("finished")})
        starts.append(rec.get("started") or "")
        ends.append(rec.get("finished") or "")
        controls.append(crate.add(ContextEntity(crate, f"#control-{i}", properties={
            "@type": "ControlAction", "instrument": {"@id": steps[job.stage].id}, "object": {"@id": action.id}})))
    wanted = [entities[p] for p in (chain.files and [k for k in chain.files if Path(chain.root / k) in
                                                     {Path(t).absolute() for t in targets}]) if p in entities]
    run = crate.add_action(workflow, identifier="#run", object=list(leaves.values()), result=wanted or None, properties={
        "name": f"the softtokens workflow run that made {len(wanted)} target file(s)",
        "startTime": min(s for s in starts if s) if any(starts) else None,
        "endTime": max(e for e in ends if e) if any(ends) else None})
    crate.add_action(engine, identifier="#organize", object=controls, result=run,
                     properties={"@type": "OrganizeAction", "name": "Snakemake's run of the workflow"})
    crate.root_dataset["mentions"] = [run]
    return crate, chain


SNAKEMAKE_MARKER = ".snakemake_timestamp"   # Snakemake's own empty mark in a directory output: not a result's file


def _add_files(crate, chain: Chain, with_checkpoints: bool) -> dict:
    """Every file of the chain at its root-relative path, with its size and sha256; a model directory's weights named
    by their manifest's hash and left out unless ``with_checkpoints``."""
    from rocrate.model.contextentity import ContextEntity

    out = {}
    for rel in sorted(chain.files):
        src = chain.root / rel
        if src.is_file():
            out[rel] = crate.add_file(src, dest_path=rel, properties=_file_props(src))
            side = record_path(src)
            if side != src and side.is_file():   # its record beside it (a sidecar): what the file is checked against
                crate.add_file(side, dest_path=side.relative_to(chain.root).as_posix(), properties=_file_props(side))
            continue
        parts = []
        for f in sorted(p for p in src.rglob("*") if p.is_file() and p.name != SNAKEMAKE_MARKER):
            inner = f.relative_to(chain.root).as_posix()
            if f.suffix == WEIGHTS and not with_checkpoints and is_model(src):
                parts.append(crate.add(ContextEntity(crate, f"#weights:{inner}", properties={
                    "@type": "CreativeWork", "name": inner, "description": NOT_INCLUDED, **_file_props(f)})))
            else:
                parts.append(crate.add_file(f, dest_path=inner, properties=_file_props(f)))
        out[rel] = crate.add_dataset(None, dest_path=rel.rstrip("/") + "/", properties={
            "name": rel, "description": f"a directory of {len(parts)} files"
            + (f" (its manifest: {STATE_FILE})" if (src / STATE_FILE).is_file() else ""),
            "sha256": (chain.files[rel].get("output") or {}).get("sha256", ""), "hasPart": parts})
    return out


def write_crate(target: Path, out: Path, with_checkpoints: bool = False, as_zip: bool = False) -> Path:
    """The crate of ``target`` written to ``out`` (a directory, or ``out``.zip with ``as_zip``); returns where."""
    crate, _ = build_crate(target_files(target), with_checkpoints)
    out = Path(out)
    if out.exists():
        shutil.rmtree(out) if out.is_dir() else out.unlink()
    if as_zip:
        zipped = out.with_suffix(".zip")
        crate.write_zip(zipped)
        return zipped
    crate.write(out)
    return out
