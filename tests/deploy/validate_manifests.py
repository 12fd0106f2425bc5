#!/usr/bin/env python3
"""Validates every object of rendered Kubernetes manifests strictly against published schemas.

    validate_manifests.py --kubernetes-version 1.37.0 RENDERED.yaml...

Run with the tests' virtual environment (tests/python/requirements.txt); called by
tests/deploy/manifest_kubectl_test.cc on `kubectl kustomize` output. Each object is checked
against:

- the Kubernetes API's own kinds (Namespace, StatefulSet, Service, ...): the OpenAPI schemas of
  that Kubernetes release that `kubernetes-validate` ships, in their strict variant (an unknown
  field anywhere is an error, as `kubernetes-validate --strict` does);
- the Prometheus Operator's kinds (monitoring.coreos.com/v1 ServiceMonitor, PodMonitor, ...):
  the JSON schema of the models that `cloudcoil-models-prometheus-operator` generates from the
  operator's CRDs, made strict the same way (every object with listed properties refuses others);
- any other kind: an error (nothing would check it).

Prints one line per object ("ok KIND/NAME (FILE): ..." or "error KIND/NAME (FILE): ...") and a
last line "N objects, M failed"; exits 1 if any object failed, 2 on bad usage or an unreadable
file.
"""
import argparse
import sys

import jsonschema
import kubernetes_validate
import yaml


def strict(schema):
    """Every object schema that lists its properties allows no others (as --strict does)."""
    if isinstance(schema, dict):
        if schema.get("type") == "object" and "properties" in schema and (
            "additionalProperties" not in schema
        ):
            schema["additionalProperties"] = False
        for value in schema.values():
            strict(value)
    elif isinstance(schema, list):
        for value in schema:
            strict(value)
    return schema


_operator_schemas = {}


def operator_schema(api_version, kind):
    """The strict JSON schema of a monitoring.coreos.com kind, or None when there is none."""
    key = (api_version, kind)
    if key not in _operator_schemas:
        from cloudcoil.models import prometheus_operator

        version = api_version.split("/", 1)[1]
        module = getattr(prometheus_operator, version, None)
        model = getattr(module, kind, None) if module is not None else None
        _operator_schemas[key] = (
            strict(model.model_json_schema(by_alias=True)) if model is not None else None
        )
    return _operator_schemas[key]


def describe(error):
    """One line for a jsonschema error: where, and the most specific reason."""
    best = jsonschema.exceptions.best_match([error])
    return f"{best.json_path}: {best.message}"


def check(obj, kubernetes_version):
    api_version = str(obj.get("apiVersion", ""))
    kind = str(obj.get("kind", ""))
    if api_version.startswith("monitoring.coreos.com/"):
        schema = operator_schema(api_version, kind)
        if schema is None:
            return f"no Prometheus Operator schema for {api_version} {kind}"
        errors = sorted(
            jsonschema.Draft202012Validator(schema).iter_errors(obj), key=lambda e: e.json_path
        )
        if errors:
            return "; ".join(describe(e) for e in errors)
        return None
    try:
        kubernetes_validate.validate(obj, kubernetes_version, strict=True)
    except kubernetes_validate.SchemaNotFoundError as e:
        return f"no Kubernetes {kubernetes_version} schema: {e}"
    except kubernetes_validate.ValidationError as e:
        return f"{e.json_path}: {e.message}"
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubernetes-version", required=True)
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()
    failed = 0
    checked = 0
    for path in args.files:
        try:
            with open(path, encoding="utf-8") as f:
                objects = [o for o in yaml.safe_load_all(f) if o]
        except (OSError, yaml.YAMLError) as e:
            print(f"error: {path}: {e}", file=sys.stderr)
            return 2
        for obj in objects:
            name = f"{obj.get('kind')}/{(obj.get('metadata') or {}).get('name')}"
            problem = check(obj, args.kubernetes_version)
            checked += 1
            if problem:
                failed += 1
                print(f"error {name} ({path}): {problem}")
            else:
                schema = (
                    "prometheus-operator CRD"
                    if str(obj.get("apiVersion", "")).startswith("monitoring.coreos.com/")
                    else f"Kubernetes {args.kubernetes_version}"
                )
                print(f"ok {name} ({path}): strict {schema} schema")
    print(f"{checked} objects, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
