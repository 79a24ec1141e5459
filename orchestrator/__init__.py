"""dsorch: plan, emit and launch 3D-parallel LLM training (DeepSpeed / Megatron-LM) on SLURM."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys

__version__ = "0.1.0"

# Jobs queued before the re-layout are pickled by submitit under the class paths of the flat layout
# (``orchestrator.slurm.TrainingJob``, ``orchestrator.doctor.DoctorJob``); a node that unpickles one
# after an upgrade finds the module that now holds those classes, run/jobs.py, under the old name
# here. For one release; then the table goes, and such a job fails with ModuleNotFoundError naming
# the old path (README, "Code").
MOVED_MODULES = {
    "orchestrator.slurm": "orchestrator.run.jobs",
    "orchestrator.doctor": "orchestrator.run.jobs",
}


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old module name as the module that now holds its classes (the same object, so
    that an unpickled job is an instance of today's class)."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in MOVED_MODULES:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec):
        module = importlib.import_module(MOVED_MODULES[spec.name])
        spec.loader_state = module.__spec__
        return module

    def exec_module(self, module):
        # The import system set the alias's spec on the module object; give it back its own.
        module.__spec__ = module.__spec__.loader_state


sys.meta_path.append(_MovedModuleFinder())
