// Small static programs for the kind cluster on machines without a registry
// (see docs/kind.md). No dependencies beyond the standard library.
module mpijob-elastic/kind-tools

go 1.24
