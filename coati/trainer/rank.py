"""What every rank of a trainer group does alike, for the RL run's ``Consumer`` (consumer.py) and an SFT/RM
stage's ``StageRank`` (stage_rank.py): start as an actor's process with its thread budget, host the rendezvous
on rank 0, join the group and build its one ``TrainerMesh``, hand out and save the policy's full weights, and
leave the group at the end. Each subclass builds its own models, step and checkpoint in ``setup``.
"""

from __future__ import annotations

import torch

from coati.cluster.trainer_group import rendezvous_address
from coati.plugins.mesh import TrainerMesh
from coati.trainer.roles import ACTOR, TrainedModel
from coati.utils.actor_process import start_actor_process


class TrainerRank:
    master_port: int | None = None  # the rendezvous port, when the run fixes one (else a free one)

    def __init__(self, rank: int, num_threads: int | None, actor: bool = True, parts=None):
        if actor:
            start_actor_process(parts)  # parts: the run's UserParts, before anything is built
        if num_threads:  # Ray actors get a share of the cores; in-process the caller's setting stands
            torch.set_num_threads(num_threads)
        self.rank = rank
        self.mesh: TrainerMesh | None = None  # the group's one mesh, shared by every role's plugin
        self.roles: dict[str, TrainedModel] = {}  # the policy (ACTOR) first, then e.g. a critic (roles.py)
        self.plugin = None  # the policy's: it sets the data-parallel shares and sends the weights
        self.tokenizer = None

    def rendezvous_address(self) -> tuple[str, int]:
        """(address, port) for the trainer group's rendezvous, hosted by this actor (rank 0) on its own node."""
        return rendezvous_address(self.master_port)

    def join_group(self, layout, master_address: str, master_port: int) -> TrainerMesh:
        """Join the trainer group of ``layout`` (a TrainerLayout; every rank at once) and build its mesh."""
        if layout.plugin_spec.distributed:
            from coati.plugins.dist import init_trainer_group

            init_trainer_group(self.rank, layout.num_trainers, master_address, master_port)
        self.mesh = TrainerMesh.build(layout.parallel_dims)
        return self.mesh

    def save_pretrained(self, path: str) -> str:
        """Collective: the policy as an HF directory (the sender writes it, with the tokenizer)."""
        self.plugin.save_pretrained(path)
        if self.plugin.is_weight_sender:
            self.tokenizer.save_pretrained(path)
        return path

    def full_state(self, role: str = ACTOR) -> dict[str, torch.Tensor]:
        """Full weights of a trained model as a plain dict on the sender (tests compare them across runs and
        layouts); collective."""
        return {name: tensor.clone() for name, tensor in self.roles[role].plugin.named_full_tensors()}

    def shutdown(self) -> None:
        """Leave the trainer group: release every role's plugin, the mesh, then the default process group."""
        for role in self.roles.values():
            role.close()
        if self.mesh is not None:
            self.mesh.close()
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
