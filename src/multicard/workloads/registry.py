"""What the runner needs of each workload: one `Workload` entry per workload name, one signature.

- `prepare`: before the first trial, make the inputs exist and check them (Scenario B trees; LLM
  tokenizer, data and weights); returns what datasets.json records.
- `unrunnable`: why this machine (`Machine`: its GPUs as a trial's CUDA will see them, its NUMA
  topology, its tools) cannot run a config (the trial is recorded as skipped).
- `command`: the trial's argv and the environment it adds.
- `page_cache`: the page-cache state a trial wants for its files, (mode, tree), set on every
  node just before the launch, outside the trial's clock; None for none.
- `result`: the trial's result dict ({"metrics": ...}) from its directory, or None.

Nothing here imports torch; the rank entry points (multicard.workloads.*) do.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from multicard import integrity
from multicard.data import llm as llm_assets
from multicard.data import mnist, scenario_b
from multicard.errors import InputError
from multicard.measure import counters, devices, numa
from multicard.plan import launch
from multicard.plan import spec as specmod
from multicard.plan.params import Value
from multicard.plan.spec import Spec
from multicard.profiling import nsys
from multicard.workloads import llm

Settings = Mapping[str, Value]
Reason = tuple[str, str] | None


@dataclass(frozen=True)
class TrialLaunch:
    """How one trial is started: its trace mode and, across nodes, its rendezvous."""

    trace: str = "none"
    rdzv: launch.Rendezvous | None = None  # where the nodes meet (several nodes per trial)


HOOKS = Path(__file__).resolve().parents[1] / "hooks"


@dataclass(frozen=True)
class Machine:
    """What the runner knows of this node before any trial, looked up once (tests build one)."""

    gpus: list[devices.GpuIdentity]  # as CUDA will number them in a trial (CUDA_VISIBLE_DEVICES)
    topology: numa.Topology
    numactl: bool  # numactl is on PATH
    cuda_visible_devices: str | None = None


def this_machine(gpus: list[devices.GpuIdentity]) -> Machine:
    # the NUMA policies bind within this job's CPUs and memory nodes, not the whole node's
    return Machine(gpus, numa.allocated(numa.live(with_links=False)), shutil.which("numactl") is not None,
                   os.environ.get("CUDA_VISIBLE_DEVICES"))


# An image that cannot run a workload says why in MULTICARD_NO_<WORKLOAD> (the paper-exact image:
# torch 2.2.2 is older than torchtune needs); a run of that workload is refused with the reason.
def refused_here(workload: str) -> str | None:
    return os.environ.get(f"MULTICARD_NO_{workload.upper()}") or None


@dataclass(frozen=True)
class Workload:
    prepare: Callable[[Spec, Path, Callable[[str], None]], dict[str, Any]]
    unrunnable: Callable[[Settings, str, Machine], Reason]
    command: Callable[[Settings, Path, Path, TrialLaunch], tuple[list[str], dict[str, str]]]
    page_cache: Callable[[Settings, Path], tuple[str, Path] | None]
    result: Callable[[Path, Settings], dict[str, Any] | None]
    sample_memory: bool  # the runner samples the trial's RSS and GPU memory (LLM: the recipe cannot)


def _needs_gpus(settings: Settings, machine: Machine, bf16: bool) -> Reason:
    needed = int(settings["gpus"])
    if settings["device"] != "cuda":
        return None
    if needed > len(machine.gpus):
        return "NotEnoughGPUs", f"needs {needed} GPUs per node, {len(machine.gpus)} visible"
    if bf16 and (why := devices.bf16_unsupported(machine.gpus[:needed])):
        return "BF16NotSupported", why
    return None


def read_result(trial_dir: Path, settings: Settings) -> dict[str, Any] | None:
    try:
        result = json.loads((trial_dir / "result.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return result if isinstance(result, dict) and isinstance(result.get("metrics"), dict) else None


def vision_result(trial_dir: Path, settings: Settings) -> dict[str, Any] | None:
    """The ranks' result.json, with the DRAM counters perf wrote after the ranks ended."""
    result = read_result(trial_dir, settings)
    if result is None:
        return None
    how = None
    if settings.get("numa_counters"):
        found, why = counters.trial_metrics(trial_dir / counters.DIRECTORY, int(result["world_size"]))
        how = counters.how_counted(trial_dir / counters.DIRECTORY, int(result["world_size"]))
    else:
        found, why = dict.fromkeys(counters.METRICS), dict.fromkeys(counters.METRICS, "numa_counters is off")
    result["metrics"] |= found
    result["unmeasured"] = {**result.get("unmeasured", {}), **why}
    if how is not None:
        result["measured_how"] = {**result.get("measured_how", {}), **dict.fromkeys(counters.METRICS, how)}
    return result


# --- vision ----------------------------------------------------------------------------------

def vision_prepare(spec: Spec, data_dir: Path, echo: Callable[[str], None]) -> dict[str, Any]:
    """Prepare (when missing) and verify every Scenario B tree the plan reads.

    A tree that exists is used as it is, a `--limit`ed one included: datasets.json says what it
    holds, and a trial asking for more images than it has fails with that message."""
    needed = sorted({(int(s["image_size"]), str(s["data_format"]))
                     for _, _, s in specmod.configs(spec) if s.get("scenario") == "b"})
    used = {}
    for size, fmt in needed:
        tree = scenario_b.tree_path(data_dir, size, fmt)
        if not (tree / scenario_b.DATASET_JSON).exists():
            scenario_b.prepare(scenario_b.Request(data_dir / "mnist", tree, size, fmt), echo=echo)
        echo(f"verifying {tree} against its manifest")
        result = scenario_b.verify(tree)
        if not result.ok:
            bad = (result.malformed + result.missing + result.changed + result.unlisted)[:5]
            raise InputError(f"{tree}: does not match its manifest ({', '.join(bad)}); "
                             "delete it and run again to prepare it anew")
        used[str(tree)] = {"manifest_sha256": integrity.sha256_file(tree / scenario_b.MANIFEST),
                           "dataset": scenario_b.read_description(tree)}
    return used


def vision_unrunnable(settings: Settings, trace: str, machine: Machine) -> Reason:
    if reason := _needs_gpus(settings, machine, bf16=settings.get("precision") == "bf16"):
        return reason
    if settings.get("loader") == "dali" and importlib.util.find_spec("nvidia.dali") is None:
        return "DaliNotInstalled", "loader = 'dali' but nvidia.dali is not installed here"
    policy = str(settings.get("numa_policy", "none"))
    if policy in numa.TORCHRUN_POLICIES:
        return torchrun_binding_unrunnable(policy, str(settings["device"]), machine, int(settings["gpus"]))
    if policy != "none":
        if not machine.numactl:
            return "NumactlNotInstalled", f"numa_policy = {policy!r} needs numactl on PATH"
        try:
            for local_rank in range(int(settings["gpus"])):
                home = numa.home_node(machine.topology, str(settings["device"]), local_rank,
                                      machine.cuda_visible_devices)
                numa.numactl_args(policy, machine.topology, home)
        except numa.PolicyNotApplicableError as exc:
            return "NumaPolicyNotApplicable", str(exc)
    return None


def torchrun_binding_unrunnable(policy: str, device: str, machine: Machine, gpus: int = 1) -> Reason:
    """Why torchrun's own `--numa-binding` cannot bind this config's ranks here, or None: among
    the reasons, a GPU of the trial whose NUMA node is unknown (sysfs says -1), which torchrun
    would take for node 0."""
    # the device first: a CPU run gives the same reason under every torch
    if device != "cuda":
        return "TorchrunBindingNeedsGpu", (f"numa_policy = {policy!r}: torchrun binds each worker near "
                                           "its accelerator, and a CPU run has none")
    mode = numa.TORCHRUN_POLICIES[policy]
    modes, why = launch.torchrun_binding_modes()
    if why:
        return "TorchrunBindingNotAvailable", f"numa_policy = {policy!r}: {why}"
    if mode not in modes:
        return "TorchrunBindingNotAvailable", (f"numa_policy = {policy!r}: this torch's --numa-binding "
                                               f"offers {', '.join(sorted(modes))}, not {mode}")
    if not machine.numactl:
        return "NumactlNotInstalled", f"numa_policy = {policy!r}: torchrun's binding runs numactl"
    for local_rank in range(gpus):
        if numa.home_node(machine.topology, device, local_rank, machine.cuda_visible_devices) is None:
            return "GpuNumaNodeUnknown", (f"numa_policy = {policy!r}: the NUMA node of the trial's GPU "
                                          f"{local_rank} is unknown (sysfs says -1, or NVML does not "
                                          "list it), which torchrun would take for node 0")
    return None


def vision_command(settings: Settings, trial_dir: Path, data_dir: Path,
                   how: TrialLaunch) -> tuple[list[str], dict[str, str]]:
    profiler = nsys.wrapper(nsys.find_nsys() or "nsys", trial_dir) if how.trace == "nsys" else []
    counted = launch.counters_wrapper(trial_dir / counters.DIRECTORY) if settings["numa_counters"] else []
    wrapper = launch.rank_wrapper(str(settings["numa_policy"]), str(settings["device"]),
                                  [*counted, *profiler])
    return launch.vision_argv(settings, trial_dir, data_dir, how.trace, wrapper, how.rdzv)


def vision_page_cache(settings: Settings, data_dir: Path) -> tuple[str, Path] | None:
    if settings["scenario"] != "b":
        return None
    tree = scenario_b.tree_path(data_dir, int(settings["image_size"]), str(settings["data_format"]))
    return str(settings["page_cache"]), tree


# --- llm -------------------------------------------------------------------------------------

def llm_assets_for(settings: Settings, data_dir: Path) -> llm.Assets:
    """Where a config's weights, tokenizer and data are (generated ones under data/llm/)."""
    root = mnist.derived_root(data_dir) / "llm"
    weights = str(settings["weights"])
    checkpoint = root / "weights" / f"random-{settings['model']}-seed0" if weights == "random" \
        else Path(weights)
    generated = str(settings["tokenizer"]) == "generated"
    tokenizer = root / "tokenizer" / "tokenizer.model" if generated else Path(str(settings["tokenizer"]))
    special = root / "tokenizer" / "special_tokens.json" if generated else None
    data = {"real": root / "real", "synthetic": root / "synthetic"}.get(str(settings["data"]),
                                                                      Path(str(settings["data"])))
    return llm.Assets(checkpoint, tokenizer, special, data)


def llm_prepare(spec: Spec, data_dir: Path, echo: Callable[[str], None]) -> dict[str, Any]:
    """Generate what is generated (tokenizer, synthetic data, random weights); check the rest."""
    used: dict[str, Any] = {}
    for _, _, settings in specmod.configs(spec):
        found = llm_assets_for(settings, data_dir)
        if settings["tokenizer"] == "generated" and not found.tokenizer.exists():
            llm_assets.write_tokenizer(found.tokenizer.parent)
        if settings["data"] == "synthetic":
            llm_assets.generate_synthetic(found.data_dir)
        if settings["weights"] == "random" and not (found.checkpoint_dir / "consolidated.00.pth").exists():
            echo(f"writing random {settings['model']} weights to {found.checkpoint_dir}")
            llm_assets.random_checkpoint(found.checkpoint_dir, str(settings["model"]), seed=0)
        for path, what in ((found.tokenizer, "tokenizer"), (found.data_dir / "dataset.json", "data "
                           "(multicard data fetch-llm writes it)"),
                           (found.checkpoint_dir / "consolidated.00.pth", "checkpoint")):
            if not path.exists():
                raise InputError(f"{spec.path}: {what} not found at {path}")
        used[str(found.data_dir)] = json.loads((found.data_dir / "dataset.json").read_text())
        used[str(found.checkpoint_dir)] = {"weights": str(settings["weights"])}
    return used


def llm_unrunnable(settings: Settings, trace: str, machine: Machine) -> Reason:
    if reason := _needs_gpus(settings, machine, bf16=settings.get("dtype") == "bf16"):
        return reason
    if importlib.util.find_spec("torchtune") is None:
        return "TorchtuneNotInstalled", "torchtune is not installed here"
    name, _, _ = llm.recipe(settings)
    if settings["device"] == "cpu" and name.endswith("distributed"):
        if settings["method"] == "qat":
            return "NoSingleDeviceRecipe", ("qat has no single-device recipe in torchtune 0.6.1, "
                                            "and qat_distributed starts NCCL (GPUs only)")
        return "NeedsGPUs", f"{name} starts NCCL in torchtune 0.6.1 (GPUs only)"
    if trace == "nsys":
        return "TraceNotSupported", "LLM trials trace with torchtune's own profiler (--trace torch)"
    return None


def llm_command(settings: Settings, trial_dir: Path, data_dir: Path,
                how: TrialLaunch) -> tuple[list[str], dict[str, str]]:
    argv = llm.argv(settings, trial_dir, llm_assets_for(settings, data_dir), how.trace, how.rdzv)
    if not settings["pin_memory"]:
        return argv, {}
    hook = str(HOOKS / "pin_memory")
    paths = [hook, *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
    return argv, {"MULTICARD_PIN_MEMORY": "1", "PYTHONPATH": os.pathsep.join(paths)}


def llm_result(trial_dir: Path, settings: Settings) -> dict[str, Any] | None:
    result = llm.collect(trial_dir, settings)
    if result is not None:
        (trial_dir / "result.json").write_text(json.dumps(result, indent=1))
    return result


WORKLOADS: dict[str, Workload] = {
    "vision": Workload(vision_prepare, vision_unrunnable, vision_command, vision_page_cache, vision_result,
                       sample_memory=False),
    "llm": Workload(llm_prepare, llm_unrunnable, llm_command, lambda settings, data_dir: None,
                    llm_result, sample_memory=True),
}
