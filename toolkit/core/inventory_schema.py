"""The schema of the dsv4kit inventory variables (``dsv4_*``), shared by every command.

The inventory is an ordinary Ansible inventory (YAML or INI) plus ``group_vars/`` and
``host_vars/`` beside it. Ansible reads it for ``dsv4kit provision``; ``dsv4kit.core.inventory``
reads it through ansible-core's own inventory API for the other commands and checks every
``dsv4_*`` variable against ``FIELDS``.

Each entry: name -> (python type(s), description). Values are checked once Ansible has merged
and templated them. Unknown ``dsv4_*`` names are errors (they are almost always typos), as are
other names very close to a known one.
Host-level connection settings use Ansible's own names (``ansible_host``, ``ansible_port``, ...),
listed in ``CONNECTION_FIELDS``.
"""

from __future__ import annotations

# Pins and layout. The values themselves live in inventory/group_vars/all.yml, the one place
# for versions; role defaults only document them.
FIELDS: dict[str, tuple[type | tuple[type, ...], str]] = {
    # --- versions (all pins) ---
    "dsv4_driver_branch": (str, "NVIDIA driver branch, open kernel modules (>= 580 for Blackwell)."),
    "dsv4_driver_version": (str, "A point release of dsv4_driver_branch to pin (e.g. '580.95.05'); empty: the newest of the branch."),
    "dsv4_cuda_keyring_version": (str, "Version of NVIDIA's cuda-keyring package (e.g. '1.1-1'), installed unless its source is there."),
    "dsv4_cuda_version": (str, "CUDA toolkit version, e.g. '13.0' (apt package cuda-toolkit-13-0)."),
    "dsv4_python_version": (str, "Python version of the SGLang venv, e.g. '3.12'."),
    "dsv4_torch_version": (str, "torch version installed in the venv (must match SGLang's pin)."),
    "dsv4_torch_index_url": (str, "Package index for the CUDA build of torch."),
    "dsv4_triton_version": (str, "triton version installed in the venv."),
    "dsv4_sglang_version": (str, "SGLang version; the kernels' rollout supports 0.5.23."),
    "dsv4_sglang_router_version": (str, "sglang-router version (the PD router in front of prefill and decode)."),
    "dsv4_flash_attn_version": (str, "flash-attn version built from source for sm_120."),
    "dsv4_flash_attn_arch_list": (str, "TORCH_CUDA_ARCH_LIST for the flash-attn build, e.g. '12.0'."),
    "dsv4_venv_packages": (list, "pip requirement specs installed into the SGLang venv; each 'name==version' is verified afterwards."),
    # --- hardware and layout ---
    "dsv4_gpu_present": (bool, "False on a GPU-less test target: GPU, kernel-module and reboot steps run in check mode."),
    "dsv4_gpu_count": (int, "GPUs expected on the box (nvidia-smi -L / lspci)."),
    "dsv4_prefill_gpus": (list, "GPU indices of the prefill server."),
    "dsv4_decode_gpus": (list, "GPU indices of the decode server."),
    "dsv4_validate_gpu": (int, "GPU `dsv4kit validate --host H` runs on when --gpu is not given (a decode GPU)."),
    "dsv4_driver_skip_reboot": (bool, "Install the driver but never reboot; while a reboot is pending the playbook stops that host with a message."),
    "dsv4_flash_attn_nvcc_threads": (int, "NVCC_THREADS for the flash-attn build; MAX_JOBS is derived from RAM (~5 GB per nvcc thread)."),
    # --- host tuning ---
    "dsv4_nvidia_uvm_options": (str, "Options line for the nvidia_uvm module (modprobe.d), e.g. 'uvm_disable_hmm=1'."),
    "dsv4_nccl_env": (dict, "NCCL environment of the serving units on a PCIe box (name -> value)."),
    # --- serving ---
    "dsv4_model": (str, "The model the boxes serve: a key of dsv4_models (DeepSeek-V4-Flash or DeepSeek-V4-Flash-0731)."),
    "dsv4_models": (dict, "The models to choose from: name -> {repo, revision (a commit), drafter (the revision's DSpark draft folder, or '')}."),
    "dsv4_model_drafter": (str, "The model's DSpark drafter: 'bundled' (in the checkpoint, config.json's dspark_* keys), a folder of the revision (config.json and weights), or '' when it ships none."),
    "dsv4_speculative": (str, "Speculative decoding of both servers: 'off', 'EAGLE' (the checkpoint's MTP layer) or 'DSPARK' (the model's drafter)."),
    "dsv4_speculative_num_steps": (int, "EAGLE: draft steps per verify step (each verify checks steps + 1 tokens; top-k is 1)."),
    "dsv4_speculative_dspark_block_size": (int, "DSPARK: the draft block (gamma); each verify step checks gamma + 1 tokens."),
    "dsv4_speculative_min_acceptance": ((int, float), "validate --gpu: the least acceptance length (tokens per verify step) a configured drafter may show."),
    "dsv4_model_path": (str, "Model directory on the box."),
    "dsv4_served_model_name": (str, "The model's name in the OpenAI API (--served-model-name, listed by /v1/models); default: dsv4_model_repo."),
    "dsv4_model_repo": (str, "Hugging Face repository of the model, e.g. 'deepseek-ai/DeepSeek-V4-Flash'."),
    "dsv4_model_revision": (str, "Model revision: the commit hash (40 hex digits) downloaded, verified and recorded in bench records."),
    "dsv4_model_allow_unpinned": (bool, "Accept a branch name as dsv4_model_revision (the weights then follow the branch)."),
    "dsv4_hf_token": (str, "Hugging Face token for the weights download (vault it); empty: HF_TOKEN from the environment, or none."),
    "dsv4_context_length": (int, "--context-length of the servers, in tokens."),
    "dsv4_model_max_context_length": (int, "The model's maximum context (config.json max_position_embeddings); a longer dsv4_context_length or bench --ctx is refused before connecting."),
    "dsv4_router_port": (int, "Port of the router (the public endpoint)."),
    "dsv4_router_open": (bool, "True: the router listens on every address (needs dsv4_router_api_key); false: 127.0.0.1 only."),
    "dsv4_router_api_key": (str, "API key the router requires (a Vault value); empty: no key."),
    "dsv4_prefill_port": (int, "Port of the prefill server."),
    "dsv4_decode_port": (int, "Port of the decode server."),
    "dsv4_disaggregation_bootstrap_port": (int, "--disaggregation-bootstrap-port of the prefill server."),
    "dsv4_disaggregation_transfer_backend": (str, "--disaggregation-transfer-backend (KV transfer between prefill and decode)."),
    "dsv4_cuda_graph_max_bs_decode": (int, "--cuda-graph-max-bs-decode of the decode server (>= the top bench concurrency)."),
    "dsv4_mem_fraction_static": ((int, float), "--mem-fraction-static of both servers."),
    "dsv4_max_running_requests": (int, "--max-running-requests of both servers."),
    "dsv4_bench_slo_ttft_ms": ((int, float, type(None)), "bench goodput: the p99 TTFT limit (ms), recorded in every record; null: none."),
    "dsv4_bench_slo_tpot_ms": ((int, float, type(None)), "bench goodput: the p99 TPOT limit (ms), recorded in every record; null: none."),
    "dsv4_eval_task_floors": (dict, "eval's accuracy floor per task set: the tasks file's sha256 -> {min_accuracy, min_items}; unlisted sets are held to GSM8K's (docs/quality.md)."),
    "dsv4_kernel_flags": (dict, "Environment flags that turn the dsv4kit kernels on (name -> '0'/'1', or 'auto': the host's latest validation verdict)."),
    "dsv4_fp4_indexer": ((bool, str), "The FP4 index-K cache: true gives --enable-deepseek-v4-fp4-indexer and SGLANG_OPT_USE_TILELANG_INDEXER=0 on both servers (docs/sglang-contract.md §2.10); 'auto': on only with the host's indexer_fp4 verdict and a passing `eval --ab dsv4_fp4_indexer=false,true` (docs/rollout.md)."),
    "dsv4_server_extra_args": (list, "Extra sglang.launch_server arguments, one list item each."),
    "dsv4_service_user": (str, "System user that runs the serving units (created when missing; an existing user is left as is)."),
    "dsv4_health_timeout": (int, "Seconds the playbook waits for /server_info after (re)starting the serving units."),
    "dsv4_package_timeout": (int, "Seconds an apt, pip or package-repository task may run before Ansible stops it."),
    "dsv4_dpkg_lock_timeout": (int, "Seconds an apt or dpkg step waits for dpkg's lock (held by unattended-upgrades, say) before it stops naming the holder."),
    # --- monitoring (docs/monitoring.md) ---
    "dsv4_monitoring": (bool, "Run the monitoring role (Prometheus, Alertmanager, node_exporter, DCGM exporter, Grafana)."),
    "dsv4_monitoring_open": (bool, "Monitoring listens on every address; false: the box's loopback only (`dsv4kit monitor` tunnels)."),
    "dsv4_monitoring_host": (str, "Inventory host that runs Prometheus, Alertmanager and Grafana for every box; empty: the group's first."),
    "dsv4_monitoring_retention_size": (str, "Prometheus's size-bounded retention, e.g. '20GB'."),
    "dsv4_monitoring_retention_time": (str, "Prometheus's time-bounded retention, e.g. '30d'."),
    "dsv4_monitoring_ttft_slo_ms": ((int, float, type(None)), "TTFT p99 alert limit (ms); null: dsv4_bench_slo_ttft_ms."),
    "dsv4_monitoring_spec_accept_qualified": ((int, float, type(None)), "Speculative acceptance length the qualifying eval recorded; null: no acceptance alert."),
    "dsv4_monitoring_spec_accept_share": ((int, float), "The acceptance alert fires below this share of dsv4_monitoring_spec_accept_qualified."),
    "dsv4_monitoring_alert_webhooks": (list, "Alertmanager webhook receiver URLs."),
    "dsv4_monitoring_textfile_dir": (str, "node_exporter's textfile collector directory under dsv4_prefix "
                                          "(the rollout and validate/eval/bench write the dashboard's box series)."),
    "dsv4_prometheus_apt_versions": (dict, "Per Ubuntu release, the pinned versions of prometheus, prometheus-alertmanager and prometheus-node-exporter."),
    "dsv4_dcgm_exporter_version": (str, "NVIDIA DCGM exporter release (<DCGM>-<exporter>) the rules and dashboard are written for."),
    "dsv4_dcgm_exporter_package": (str, "apt package of the DCGM exporter (CUDA repository)."),
    "dsv4_dcgm_exporter_package_version": (str, "apt version of dsv4_dcgm_exporter_package."),
    "dsv4_dcgm_version": (str, "apt version of datacenter-gpu-manager-4-core (the DCGM the exporter pairs with)."),
    "dsv4_grafana_enabled": (bool, "Install Grafana with the provisioned datasource and dashboard."),
    "dsv4_grafana_version": (str, "Grafana version (Grafana's apt repository)."),
    "dsv4_grafana_admin_password": (str, "Grafana's admin password (vault it); required when Grafana is enabled."),
    # --- paths on the box ---
    "dsv4_prefix": (str, "Root under which every dsv4kit path lives ('/' on a real box, a scratch dir in tests)."),
    "dsv4_venv_dir": (str, "The SGLang venv (absolute path)."),
    "dsv4_state_dir": (str, "dsv4kit state on the box: freeze files, build logs, cached wheels, scratch."),
    # --- connection policy (control machine side) ---
    "dsv4_known_hosts": (str, "known_hosts file used to verify host keys (fabric and ansible)."),
    "dsv4_connect_timeout": ((int, float), "Seconds to wait for an SSH connection."),
}

CONNECTION_FIELDS: dict[str, tuple[type | tuple[type, ...], str]] = {
    "ansible_host": (str, "Address of the box."),
    "ansible_port": (int, "SSH port."),
    "ansible_user": (str, "SSH user."),
    "ansible_ssh_private_key_file": (str, "Private key file for SSH."),
    "ansible_become": (bool, "Use sudo for privileged tasks."),
    "ansible_python_interpreter": (str, "Python Ansible uses on the box."),
    "ansible_ssh_common_args": (str, "Extra ssh arguments for Ansible."),
    "ansible_connection": (str, "Ansible connection plugin (ssh)."),
}

REQUIRED = ("dsv4_venv_dir", "dsv4_context_length", "dsv4_decode_port", "dsv4_gpu_count")
