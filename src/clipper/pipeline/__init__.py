"""Pipelines: applications whose answer is a small DAG of model stages under one deadline.

``spec`` parses and checks a description, ``plan`` splits the deadline among the stages, and
``run`` (imported by the frontend, not here: it needs the query path) executes one query.
See docs/pipelines.md.
"""

from clipper.pipeline.spec import Pipeline, Ref, Stage, check_against, parse_pipeline

__all__ = ["Pipeline", "Ref", "Stage", "check_against", "parse_pipeline"]
