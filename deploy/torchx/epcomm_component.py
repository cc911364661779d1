"""TorchX component: epcomm's MoE layer example (examples/moe_layer) on
`nnodes` EKS nodes of 8 GPUs and 16 EFA devices (P5en), over EFA.

    torchx run -s kubernetes -cfg namespace=default,queue=default \\
        deploy/torchx/epcomm_component.py:moe_layer --nnodes 48 \\
        --image REGISTRY/epcomm:latest

Each node runs one torchrun agent with the flags deploy/local_two_nodes.sh
runs on one host (static rendezvous at node 0, --no_python, the per-rank
--redirects/--tee mappings Debian's torch 1.13 needs under Python 3.11);
each rank is one `moe_layer --launcher env`, which reads torchrun's
variables and rendezvous on MASTER_PORT + 1 with the job's run id.

TorchX is not packaged in Debian, so this file is not exercised by the test
suite; its command is (deploy_torchrun_* tests, through local_two_nodes.sh).
"""

import torchx.specs as specs

# What libfabric needs on EFA, and why.
EFA_ENV = {
    "FI_PROVIDER": "efa",
    # GPUDirect RDMA: the NIC reads and writes GPU memory (H100/H200 and later).
    "FI_EFA_USE_DEVICE_RDMA": "1",
    # torchrun forks its workers; a fork after memory registration must not
    # break the parent's registrations.
    "FI_EFA_FORK_SAFE": "1",
    # Peers on the same node go through libfabric's shm provider, not the NIC.
    "FI_EFA_ENABLE_SHM_TRANSFER": "1",
    # A lost node becomes an epcomm::error within this bound, never a hang.
    "EPCOMM_TIMEOUT_MS": "30000",
}

TORCHRUN_STORE_PORT = 29500  # epcomm's rendezvous takes the next port


def moe_layer(
    nnodes: int = 2,
    nproc_per_node: int = 8,
    image: str = "REGISTRY/epcomm:latest",
    efa_devices: int = 16,
    instance_type: str = "p5en.48xlarge",
    mode: str = "normal",
    dtype: str = "fp8",
    tokens: int = 4096,
    hidden: int = 7168,
    experts: int = 256,
    topk: int = 8,
) -> specs.AppDef:
    """One MoE layer (dispatch, experts, combine, checked against a reference
    on every rank) on nnodes x nproc_per_node ranks."""
    per_rank = lambda v: ",".join(f"{r}:{v}" for r in range(nproc_per_node))  # noqa: E731
    rank0 = f"$${{{specs.macros.rank0_env}:=localhost}}"
    command = " ".join([
        "exec python3 -m torch.distributed.run",
        f"--nnodes {nnodes} --node_rank {specs.macros.replica_id}",
        f"--nproc_per_node {nproc_per_node}",
        f"--rdzv_backend static --master_addr {rank0} --master_port {TORCHRUN_STORE_PORT}",
        f"--rdzv_id {specs.macros.app_id} --max_restarts 0",
        f"--redirects {per_rank(1)} --tee {per_rank(2)} --log_dir /tmp/torchrun",
        "--no_python /opt/epcomm/bin/moe_layer --launcher env",
        f"--mode {mode} --dtype {dtype} --tokens {tokens} --hidden {hidden}",
        f"--experts {experts} --topk {topk}",
    ])
    return specs.AppDef(
        name="epcomm-moe-layer",
        roles=[
            specs.Role(
                name="moe_layer",
                image=image,
                entrypoint="bash",
                args=["-c", command],
                num_replicas=nnodes,
                env=dict(EFA_ENV),
                resource=specs.Resource(
                    cpu=180,
                    gpu=nproc_per_node,
                    memMB=1_600_000,
                    capabilities={"node.kubernetes.io/instance-type": instance_type},
                    devices={"vpc.amazonaws.com/efa": efa_devices},
                ),
                port_map={"torchrun": TORCHRUN_STORE_PORT,
                          "epcomm": TORCHRUN_STORE_PORT + 1},
                max_retries=0,
            )
        ],
    )
