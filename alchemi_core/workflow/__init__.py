"""Workflows from files: ``alchemi run WORKFLOW.toml``.

* :func:`load_workflow` / :func:`parse_workflow`: a TOML file into a validated :class:`Workflow`
  (one-line :class:`WorkflowError` naming the key and the fix);
* :func:`build_plan`: the model and stages built through the registry (a :class:`Plan`);
* :func:`execute`: a plan run over any dataset into any sinks (what a data-parallel rank calls
  with its shard);
* :func:`run_workflow`: the whole of ``alchemi run``: input files or store in, results store,
  log and summary out.

Example:
    >>> from alchemi_core.workflow import parse_workflow
    >>> wf = parse_workflow('[model]\\ncomponent = "model:lennard-jones"\\nepsilon = 0.01\\nsigma = 3.4\\n'
    ...                     'cutoff = 8.5\\n[[stage]]\\ncomponent = "integrator:langevin"\\n')
    >>> [s.component.spec for s in wf.stages]
    ['integrator:langevin']
"""

from __future__ import annotations

from alchemi_core.workflow.plan import Plan, Summary, build_plan, execute, resolve_device
from alchemi_core.workflow.run import run_workflow, run_workflow_detailed
from alchemi_core.workflow.spec import Workflow, WorkflowError, load_workflow, parse_workflow

__all__ = [
    "Plan",
    "Summary",
    "Workflow",
    "WorkflowError",
    "build_plan",
    "execute",
    "load_workflow",
    "parse_workflow",
    "resolve_device",
    "run_workflow",
    "run_workflow_detailed",
]
