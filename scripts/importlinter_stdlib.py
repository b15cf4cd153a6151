"""An import-linter contract type: the given packages import only the standard library (and themselves).

Used for `deployer.supervisor`, which runs on the target with its system python3: any import of another
deployer package or of a third-party distribution would fail there. Imports of a module by its bare name
are allowed when that name is a module of the package itself (on the target the supervisor's files sit side
by side and import each other as `base`). Configured in pyproject.toml, run by `lint-imports`.
"""

from __future__ import annotations

import sys

from grimp import ImportGraph
from importlinter.application import output
from importlinter.domain import fields
from importlinter.domain.contract import Contract, ContractCheck


class StdlibOnlyContract(Contract):
    type_name = "stdlib_only"

    modules = fields.ListField(subfield=fields.StringField())

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        offences: list[tuple[str, str]] = []
        for package in self.modules:  # type: ignore[attr-defined]
            own = {package, *graph.find_descendants(package)}
            bare = {name.rpartition(".")[2] for name in own}
            for module in sorted(own):
                for imported in sorted(graph.find_modules_directly_imported_by(module)):
                    top = imported.split(".")[0]
                    if imported in own or top in sys.stdlib_module_names or imported in bare:
                        continue
                    offences.append((module, imported))
        return ContractCheck(kept=not offences, metadata={"offences": offences})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for module, imported in check.metadata["offences"]:
            output.print_error(f"{module} imports {imported} (not the standard library)", bold=False)
            output.new_line()
