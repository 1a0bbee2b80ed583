"""``admission-policy plugins``: the installed plugins and every feature gate."""
from __future__ import annotations

import click

from ... import plugins
from ..documents import dump_json
from ..options import gates_option, parse_gates


@click.command("plugins")
@gates_option
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
def plugins_command(feature_gates: str, output: str) -> None:
    """List the installed plugins (entry point group admission_policy.plugins), the ones that
    failed to load, and every feature gate with its stage, default and state."""
    found = plugins.registry()
    gates = parse_gates(feature_gates, output, found)
    rows = [{"name": name, "kind": plugin.kind, "version": plugin.version, "source": found.sources[name],
             "gate": plugin.gate_name(),
             "enabled": gates.enabled(plugin.gate_name()) and gates.enabled("PythonPlugins"),
             "description": plugin.description, "configSchema": dict(plugin.config_schema)}
            for name, plugin in sorted(found.plugins.items())]
    broken = [{"name": b.name, "source": b.source, "error": b.error} for b in found.broken]
    gate_rows = [{"name": gate.name, "stage": gate.stage, "default": gate.default, "enabled": enabled}
                 for gate, enabled in gates.items()]
    if output == "json":
        click.echo(dump_json({"plugins": rows, "broken": broken, "featureGates": gate_rows}))
        return
    click.echo("PLUGIN              KIND       VERSION  ENABLED  SOURCE")
    for row in rows:
        click.echo(f"{row['name']:<19} {row['kind']:<10} {row['version']:<8} {str(row['enabled']).lower():<8} "
                   f"{row['source']}")
        if row["description"]:
            click.echo(f"    {row['description']}")
    for item in broken:
        click.echo(f"{item['name']:<19} (failed to load from {item['source']}: {item['error']})")
    click.echo("\nFEATURE GATE             STAGE  DEFAULT  ENABLED")
    for gate in gate_rows:
        click.echo(f"{gate['name']:<24} {gate['stage']:<6} {str(gate['default']).lower():<8} "
                   f"{str(gate['enabled']).lower()}")
