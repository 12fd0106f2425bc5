// The deploy tests' own rendering of deploy/k8s: the subset of kustomize that the manifests use,
// so that the overlays are checked on every machine (Debian's kubectl 1.20 bundles a kustomize
// too old to build them; see docs/decisions/0006-manifest-validation.md). Anything outside the
// subset is an error naming the field, never a silent partial rendering:
//   resources (files, and folders rendered as kustomizations of their own), namespace,
//   labels (pairs, includeTemplates; not includeSelectors), images (name, newName, newTag),
//   replacements (source kind/name/fieldPath, targets select kind/name + fieldPaths with
//   [key=value] list selectors and \. escapes), patches (JSON 6902 add/replace/remove with a
//   target kind/name/namespace, and strategic-merge `$patch: delete` of one object).
// Pure apart from reading the files; not thread-safe only in that yaml-cpp nodes are shared.
#pragma once

#include <yaml-cpp/yaml.h>

#include <string>
#include <vector>

namespace meshrun::deploy_test {

// The objects `kustomize build DIR` would print, in resource order. `error` is empty on success.
std::vector<YAML::Node> RenderKustomization(const std::string& dir, std::string* error);

// Where two YAML trees differ ("" when they do not): maps by key regardless of order, sequences
// in order, scalars by their text; e.g. "/spec/template/metadata/labels/x: missing vs 'y'".
std::string YamlDifference(const YAML::Node& a, const YAML::Node& b, const std::string& path = "");

}  // namespace meshrun::deploy_test
