"""Pipelines: applications whose answer is a small DAG of model stages under one deadline.

Data only: ``spec`` parses and checks a description, ``plan`` splits the deadline among the
stages, ``values`` evaluates a stage's input; the query runtime's pipeline runner
(:mod:`clipper.query.pipeline`) executes one query.
See docs/pipelines.md.
"""

from clipper.pipeline.spec import Pipeline, Ref, Stage, check_against, parse_pipeline

__all__ = ["Pipeline", "Ref", "Stage", "check_against", "parse_pipeline"]
