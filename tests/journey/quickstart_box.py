"""The box of docs/quickstart.md, simulated on this machine: what `dsv4kit provision` really provisions
over a real sshd, with stand-ins only where a CPU machine has no GPU and no systemd.

* The box's SSH login and every provision task (``provision_task_environment``) see ``tools/`` first
  on PATH: ``nvidia-smi`` (tests/journey/nvidia_smi_standin.py: 8 GPUs), the ``systemctl`` and
  ``journalctl`` stand-ins (tests/journey/systemctl_standin.py: they really start the units the role
  wrote, with their environment files and start limits), ``nvidia-modprobe`` (recorded), then
  tests/fake_gpu_box.py's tools (modprobe, dkms, mokutil ...) and its apt/dpkg in the prefix, with
  NVIDIA's and the distribution's archives: the driver and CUDA stages install for real there.
* ``sglang_venv_python`` is ``tools/python3.11``: the role's ``-m venv`` makes a real venv, then
  :func:`finish_venv` gives it what an 8-GPU SGLang box has and a CPU machine lacks: torch, triton
  and sglang-router from this test environment, the SGLang 0.5.23 wheel, and a ``bin/python`` that
  runs ``-m sglang.launch_server`` (SGLang's own parser, then a stand-in server), the router
  launcher (sglang-router's own parser, then a stand-in router) and the validation harness
  (tests/journey/gpu_standin.py: the one GPU stand-in) on this machine. Everything else the role
  installs into that venv (its pinned packages, the dsv4kit wheel, the kernel flags) is real.
  ``sglang.benchmark.serving`` there is SGLang's own client; only torchvision, which a CPU torch
  cannot load, is a stand-in (tests/standins.py), as in the bench tests' client venv.
* The weights on the box (``dsv4_model_path``): a ``config.json`` and the bench tests' tiny
  tokenizer over the words the stand-in servers generate (tests/bench_support.py).
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import sysconfig
from pathlib import Path

from tests.bench_support import make_tokenizer
from tests.fake_gpu_box import MONITORING_PACKAGES, Deb, FakeGPUBox
from tests.journey import systemctl_standin
from tests.sglang_wheel import CLIENT_STANDINS, sglang_site
from tests.sshd import LoopbackSSHD

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
BASE_PYTHON = Path(getattr(sys, "_base_executable", sys.executable))
_FARM_SKIP = ("dsv4kit", "__editable__", "pip", "_distutils_hack")


class QuickstartBox:
    def __init__(self, root: Path):
        self.root = root
        self.home = root / "home"
        self.prefix = root / "box"
        self.tools = root / "tools"
        self.model = self.prefix / "models/DeepSeek-V4-Flash"
        self.units = self.prefix / "etc/systemd/system"
        for d in (self.home, self.prefix, self.tools, self.model):
            d.mkdir(parents=True, exist_ok=True)
        make_tokenizer(Path(sys.executable), self.model)
        (self.model / "config.json").write_text(
            '{"architectures": ["DeepseekV4ForCausalLM"], "model_type": "dsv4kit-test", "vocab_size": 201}\n')
        # apt/dpkg in the prefix with NVIDIA's and the distribution's archives (tests/fake_gpu_box.py)
        self.gpu = FakeGPUBox(root / "gpu", self.prefix)
        self.gpu.secure_boot(False)
        self.gpu.publish_cuda(newer=False, dcgm=True)  # with DCGM and its exporter (the monitoring role)
        self.gpu.publish_ubuntu()
        # the monitoring role's archives: the distribution's Prometheus packages (this machine's own
        # binaries) and Grafana's repository (tests/fake_gpu_box.py)
        if all(shutil.which(name) for name in MONITORING_PACKAGES):
            self.gpu.publish_distribution_monitoring()
        self.gpu.publish_grafana()
        self.gpu.run("apt-get", "update")  # the box's lists of its distribution's archive, as on any box
        # The box's own Python (dsv4_python_version), installed: sglang_venv asks dpkg for it.
        for name in ("python3.11", "python3.11-venv", "python3.11-dev"):
            deb = self.gpu.build_deb(Deb(name, "3.11.2-6"), root / "debs")
            self.gpu.run("dpkg", f"--root={self.prefix}", f"--admindir={self.prefix}/var/lib/dpkg",
                         "--force-script-chrootless", "-i", str(deb))
        path = f"{self.tools}:{self.gpu.bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        login = {**systemctl_standin.install(self.tools, root / "systemd", self.units, self.prefix), "PATH": path,
                 "DSV4KIT_STANDIN_PATH": path, "DSV4_JOURNEY_DRIVER_FILE": str(self.gpu.proc_version)}
        self.task_env = {**self.gpu.environment(), **login}
        self.role_vars = {
            "nvidia_driver_repo_url": f"file://{self.gpu.cuda_repo}/",
            "nvidia_driver_proc_version": str(self.gpu.proc_version),
            "nvidia_driver_reboot_required_pkgs": str(self.gpu.state / "reboot-required.pkgs"),
            "provision_task_environment": self.task_env,
            "sglang_venv_python": str(self.tools / "python3.11"),
            "monitoring_grafana_repo_url": f"file://{self.gpu.grafana_repo}",
            "monitoring_grafana_key_url": f"file://{self.gpu.grafana_key}",
            # the package made its grafana group in the box's root, which this machine's groups lack
            "monitoring_grafana_group": "root",
        }
        self._write_tools()
        # One SetEnv line: sshd keeps the first SetEnv it reads.
        self.sshd = LoopbackSSHD(root / "sshd", extra_config=(
            "SetEnv " + " ".join(f"{key}={value}" for key, value in login.items()),)).start()

    def _write_tools(self) -> None:
        py = shlex.quote(sys.executable)
        tools = {
            "nvidia-smi": f'exec {py} {shlex.quote(str(HERE / "nvidia_smi_standin.py"))} "$@"\n',
            "nvidia-modprobe": f'echo "nvidia-modprobe $*" >> {self.root / "module-calls"}\n',
            "python3.11": (
                f'if [ "$1" = -m ] && [ "$2" = venv ]; then {shlex.quote(str(BASE_PYTHON))} "$@" || exit $?\n'
                f'  eval "last=\\${{$#}}"\n'
                f'  exec env PYTHONPATH={shlex.quote(str(REPO))} {py} -m tests.journey.quickstart_box "$last" {shlex.quote(str(self.tools))}\nfi\n'
                f'exec {shlex.quote(str(BASE_PYTHON))} "$@"\n'),
        }
        for name, body in tools.items():
            (self.tools / name).write_text("#!/bin/sh\n" + body)
            (self.tools / name).chmod(0o755)

    def stop(self) -> None:
        for state in sorted((self.root / "systemd").glob("*.json")):
            systemctl_standin_env = {**os.environ, **self.task_env}
            import subprocess

            subprocess.run([str(self.tools / "systemctl"), "stop", state.stem], env=systemctl_standin_env,
                           capture_output=True, timeout=120)
        self.sshd.stop()
        self.gpu.close()


def p2p_log(tools: Path) -> Path:
    """Where the box venv's python logs each run of the P2P check (``-m dsv4kit.validation.p2p``)."""
    return tools.parent / "p2p-runs.log"


def finish_venv(venv: Path, tools: Path) -> None:
    """What the box's SGLang venv holds beyond the role's pins (see the module docstring), and the
    box's ``nvidia-smi`` on the units' PATH (the units put the venv's bin first)."""
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    site = venv / "lib" / version / "site-packages"
    farm = venv.parent / f".{venv.name}-test-farm"
    farm.mkdir(exist_ok=True)
    purelib = Path(sysconfig.get_paths()["purelib"])
    for entry in purelib.iterdir():
        name = entry.name.lower()
        if name.startswith(_FARM_SKIP) or name.endswith(".pth") or name == "sglang" \
                or name.startswith("sglang-") or (farm / entry.name).exists():
            continue
        (farm / entry.name).symlink_to(entry)
    hook = (f"import os, sys; os.environ.get('DSV4_JOURNEY_FAKE_CUDA') and (sys.path.append({str(REPO)!r}), "
            "__import__('tests.journey.gpu_standin').journey.gpu_standin.fake_cuda())")
    (farm / "dsv4kit_test_standins.py").write_text((REPO / "tests/standins.py").read_text())
    standins = f"import dsv4kit_test_standins; dsv4kit_test_standins.install({CLIENT_STANDINS!r})"
    (site / "zz_dsv4kit_quickstart_box.pth").write_text(f"{sglang_site()}\n{farm}\n{hook}\n{standins}\n")
    real = shlex.quote(str(venv / "bin" / version))
    python = venv / "bin/python"
    python.unlink()
    python.write_text(
        "#!/bin/sh\n"
        f'case "$1 $2" in\n'
        f'  "-m sglang.launch_server") shift 2; exec {real} {shlex.quote(str(HERE / "launch_server_standin.py"))} "$@";;\n'
        f'  "-m dsv4kit.validation.harness") shift 2; exec {real} {shlex.quote(str(HERE / "gpu_standin.py"))} "$@";;\n'
        # The P2P check runs for real (no CUDA here: it says so and exits 7); each run is logged.
        f'  "-m dsv4kit.validation.p2p") echo "$*" >> {shlex.quote(str(p2p_log(tools)))};;\n'
        "esac\n"
        f'case "$1" in */dsv4-router-launch) exec {real} {shlex.quote(str(HERE / "router_standin.py"))} "$@";; esac\n'
        f'if [ "$1" = -c ] && [ "$3" = torch ]; then DSV4_JOURNEY_FAKE_CUDA=1 exec {real} "$@"; fi\n'
        f'exec {real} "$@"\n')
    python.chmod(0o755)
    (venv / "bin/nvidia-smi").symlink_to(tools / "nvidia-smi")


if __name__ == "__main__":
    finish_venv(Path(sys.argv[1]), Path(sys.argv[2]))
