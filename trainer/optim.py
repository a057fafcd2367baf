"""AdamW through PyTorch's functional kernel, with its state created up front.

Why not `torch.optim.AdamW`: its constructor and `step()` import the whole torch._dynamo
compiler stack (~1.2 s) in every process. A crash-tested run starts many processes, and
that second is most of the crash-to-first-resumed-step latency. The arithmetic here is
PyTorch's own (`torch.optim.adam.adam` with decoupled weight decay, single-tensor path).

Why state up front: torch.optim creates the moments lazily on the first step, so a
checkpoint at step 0 holds none, and a loader that builds its optimizer after loading can
silently drop them. Here every parameter has its moments and step count from the start,
and `load_state_dict` refuses a state that does not match the parameters.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.optim.adam import adam


class AdamW:
    def __init__(
        self,
        groups: list[dict[str, Any]],
        *,
        lr: float,
        betas: tuple[float, float],
        eps: float = 1e-8,
    ) -> None:
        self.param_groups: list[dict[str, Any]] = []
        for g in groups:
            self.param_groups.append(
                {
                    "params": list(g["params"]),
                    "lr": lr,
                    "betas": betas,
                    "eps": eps,
                    "weight_decay": float(g.get("weight_decay", 0.0)),
                }
            )
        self.state: list[dict[str, torch.Tensor]] = [
            {
                "step": torch.zeros((), dtype=torch.float32),
                "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
            }
            for p in self._params()
        ]

    def _params(self) -> list[torch.Tensor]:
        return [p for g in self.param_groups for p in g["params"]]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self._params():
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        i = 0
        for g in self.param_groups:
            params, grads, avgs, sqs, steps = [], [], [], [], []
            for p in g["params"]:
                s = self.state[i]
                i += 1
                if p.grad is None:
                    continue
                params.append(p)
                grads.append(p.grad)
                avgs.append(s["exp_avg"])
                sqs.append(s["exp_avg_sq"])
                steps.append(s["step"])
            if not params:
                continue
            beta1, beta2 = g["betas"]
            adam(
                params, grads, avgs, sqs, [], steps,
                foreach=False, decoupled_weight_decay=True, amsgrad=False,
                beta1=beta1, beta2=beta2, lr=g["lr"], weight_decay=g["weight_decay"],
                eps=g["eps"], maximize=False,
            )  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        """torch.optim's layout: parameters by index, moments per parameter."""
        groups, start = [], 0
        for g in self.param_groups:
            n = len(g["params"])
            groups.append({**{k: v for k, v in g.items() if k != "params"},
                           "params": list(range(start, start + n))})  # fmt: skip
            start += n
        return {"state": dict(enumerate(self.state)), "param_groups": groups}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        params = self._params()
        saved = state["state"]
        if len(saved) != len(params) or len(state["param_groups"]) != len(self.param_groups):
            raise ValueError(
                f"optimizer state holds {len(saved)} parameters in "
                f"{len(state['param_groups'])} groups; this model has {len(params)} in "
                f"{len(self.param_groups)}"
            )
        for i, p in enumerate(params):
            s = saved[i]
            for key in ("exp_avg", "exp_avg_sq"):
                if s[key].shape != p.shape:
                    raise ValueError(
                        f"optimizer {key} of parameter {i} has shape {tuple(s[key].shape)}, "
                        f"the parameter {tuple(p.shape)}"
                    )
            self.state[i] = {
                "step": s["step"].detach().clone().to(torch.float32),
                "exp_avg": s["exp_avg"].detach().clone().to(p.device),
                "exp_avg_sq": s["exp_avg_sq"].detach().clone().to(p.device),
            }
        for g, sg in zip(self.param_groups, state["param_groups"], strict=True):
            g.update({k: v for k, v in sg.items() if k != "params"})
            g["betas"] = tuple(g["betas"])
