"""Checks deploy/ without a cluster: the manifests parse, carry what an EFA
job needs, and launch with the flags deploy/local_two_nodes.sh runs (which the
deploy_torchrun_* tests exercise); the TorchX component sets the same EFA
environment as the Job. No Kubernetes schema validator is packaged in Debian,
so the API schema itself is not checked here."""

import ast
import pathlib
import re
import sys

import yaml

root = pathlib.Path(sys.argv[1])
failures = []


def need(ok, what):
    if not ok:
        failures.append(what)


def load(path):
    with open(root / path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


# The Job and its headless Service.
docs = {d["kind"]: d for d in load("deploy/k8s/moe-layer-job.yaml")}
need(set(docs) == {"Service", "Job"}, f"moe-layer-job.yaml holds {sorted(docs)}")
svc, job = docs["Service"], docs["Job"]
need(svc["spec"].get("clusterIP") == "None", "the Service is not headless")
ports = {p["name"]: p["port"] for p in svc["spec"]["ports"]}
need(ports.get("epcomm-rendezvous") == ports.get("torchrun-store", 0) + 1,
     "the Service does not expose epcomm's rendezvous at the torchrun store's port + 1")
spec = job["spec"]
pod = spec["template"]["spec"]
need(spec.get("completionMode") == "Indexed", "the Job is not Indexed (no node rank)")
need(pod.get("subdomain") == svc["metadata"]["name"], "pods are not named under the Service")
need(svc["spec"]["selector"] == {"batch.kubernetes.io/job-name": job["metadata"]["name"]},
     "the Service does not select the Job's pods")
(container,) = pod["containers"]
env = {e["name"]: e.get("value") for e in container["env"]}
need(int(env["NODES"]) == spec["completions"] == spec["parallelism"],
     "NODES, completions and parallelism differ")
limits = container["resources"]["limits"]
need(limits.get("nvidia.com/gpu") == 8, "a pod does not take all 8 GPUs of its node")
need(limits.get("vpc.amazonaws.com/efa", 0) >= 1, "no EFA devices requested")
need("hugepages-2Mi" in limits, "no hugepages for libfabric")
need("IPC_LOCK" in container["securityContext"]["capabilities"]["add"],
     "no IPC_LOCK to pin registered memory")
volumes = {v["name"]: v for v in pod["volumes"]}
shm = [m for m in container["volumeMounts"] if m["mountPath"] == "/dev/shm"]
need(len(shm) == 1 and volumes[shm[0]["name"]]["emptyDir"].get("medium") == "Memory",
     "/dev/shm is not memory-backed")
need(env.get("FI_PROVIDER") == "efa", "FI_PROVIDER is not efa")
command = " ".join(container["args"])
master = f"{job['metadata']['name']}-0.{svc['metadata']['name']}"
need(f"--master_addr {master}" in command, f"torchrun's master is not {master}")
need(f"--master_port {ports['torchrun-store']}" in command, "torchrun's port is not the Service's")
need('--node_rank "$JOB_COMPLETION_INDEX"' in command, "the node rank is not the Job index")

# The flags the tested local launch uses must be the recipe's.
script = (root / "deploy/local_two_nodes.sh").read_text()
for flag in ["--rdzv_backend static", "--max_restarts 0", "--no_python", "--redirects", "--tee"]:
    need(flag in script, f"local_two_nodes.sh lacks {flag}")
    need(flag in command, f"the Job's torchrun lacks {flag}")
need("--launcher env" in command, "the Job does not run moe_layer --launcher env")

# The TorchX component: same EFA environment, same ports (read without torchx).
tree = ast.parse((root / "deploy/torchx/epcomm_component.py").read_text())
constants = {t.id: node.value for node in tree.body if isinstance(node, ast.Assign)
             for t in node.targets if isinstance(t, ast.Name)}
efa_env = ast.literal_eval(constants["EFA_ENV"])
for name, value in efa_env.items():
    need(env.get(name) == value, f"the Job's {name} ({env.get(name)}) differs from the "
                                 f"TorchX component's ({value})")
need(ast.literal_eval(constants["TORCHRUN_STORE_PORT"]) == ports["torchrun-store"],
     "the TorchX component's torchrun port differs from the Job's")

# The node groups: EFA on, one zone each.
(cluster,) = load("deploy/eks/cluster.yaml")
for group in cluster["managedNodeGroups"]:
    need(group.get("efaEnabled") is True, f"node group {group['name']}: efaEnabled is not set")
    need(len(group.get("availabilityZones", [])) == 1,
         f"node group {group['name']} spans more than one zone")
    need(re.fullmatch(r"p5e?n?\.48xlarge", group["instanceType"]) is not None,
         f"node group {group['name']}: {group['instanceType']} is not a P5 type")

for f in failures:
    print("deploy check:", f)
print("deploy check: ok" if not failures else f"deploy check: {len(failures)} failures")
sys.exit(1 if failures else 0)
