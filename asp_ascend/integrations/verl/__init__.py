"""verl adapter: the ASP schedule and admission inside verl's own trainers.

verl (``pip install -e .[verl]``, docs/verl.md) is imported lazily: nothing here imports it
at module import. Torch-free pieces, usable on a login node:

- :mod:`.layout`: one ASP iteration -> the row order of one verl batch (mini-batch layout).
- :mod:`.sampler`: :class:`~.sampler.AspSampler`, the ``train_sampler`` verl's
  ``StatefulDataLoader`` draws from (stateful, resumable, re-planned per epoch).
- :mod:`.lengths`: verl rollout batches -> a DESIGN 6 length history.
- :mod:`.config_bridge`: verl's Hydra config + our ``asp:`` group -> :class:`asp_ascend.config.Config`.
- :mod:`.routing`: the ``priority`` that carries a group's schedule instance to verl's load balancer, and
  the guided/static server choice (pure).
- :mod:`.contract`: every verl name the adapter relies on, checked by ``asp doctor --verl``.

Pieces that need verl (:mod:`.trainer`, :mod:`.fully_async`, :mod:`.router`, :mod:`.main_ppo`) import it
through :func:`require_verl`.
"""
from __future__ import annotations

from ...errors import BackendMissingError

VERL_HINT = ("pip install -e '.[verl]' (CPU: `ASP_STACK=verl bash ci/env.sh` makes a separate virtual "
             "environment, docs/verl.md); on Ascend use verl's NPU images or its install guide")
SUPPORTED = ">=0.9.1,<0.10"


def require_verl(purpose: str = "the verl adapter"):
    """Import ``verl`` or raise BackendMissingError saying what to install."""
    return import_verl("verl", purpose)


def import_verl(module: str, purpose: str = "the verl adapter"):
    """Import one verl module, turning a missing dependency into BackendMissingError."""
    import importlib

    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        missing = (exc.name or "verl").split(".")[0]
        if missing == "verl":
            raise BackendMissingError("verl", VERL_HINT, purpose) from exc
        raise BackendMissingError(missing, f"pip install {missing} (a dependency of verl; {VERL_HINT})",
                                  f"{purpose} (imported by verl)") from exc
