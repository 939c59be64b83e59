"""Configuration fields derived from the library's settings, so a knob is declared once, in the library.

`library_field` copies a field of a pydantic settings model (WorldModelSettings, PoolSearchSettings,
...). For the training settings dataclasses, a settings field declared with `_knob` (conductor_pipeline.training.settings) is overridable: the
resource gets a field of the same name (optionally prefixed), the library's help text and the
knob's bounds. Empty (None) keeps the profile's value. Literal fields cannot be optional in Dagster
config, so theirs default to the settings class's own default (every profile's value).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Literal, get_origin, get_type_hints

from pydantic import BaseModel, Field, create_model

from conductor_pipeline.training.settings import overridable_knobs, settings_help


def library_field(settings: type[BaseModel], name: str) -> Any:
    """A library settings field (default, bounds, description) as a config field, so each knob is
    declared once, in the library. `Any`, like pydantic's `Field`: the class annotation types it."""
    return copy.deepcopy(settings.model_fields[name])


def override_fields(settings_class: type, *, prefix: str = "") -> dict[str, tuple[Any, Any]]:
    """`create_model` field definitions for the overridable knobs of `settings_class`, keyed by
    `prefix` + the library's field name."""
    hints = get_type_hints(settings_class)
    help_text = settings_help(settings_class)
    defaults = {f.name: f.default for f in dataclasses.fields(settings_class)}
    definitions: dict[str, tuple[Any, Any]] = {}
    for name, bounds in overridable_knobs(settings_class).items():
        annotation = hints[name]
        if get_origin(annotation) is Literal:
            definitions[prefix + name] = (annotation, Field(defaults[name], description=help_text[name], **bounds))
        else:
            definitions[prefix + name] = (annotation | None, Field(None, description=help_text[name], **bounds))
    return definitions


def overrides_model(name: str, base: type, doc: str, module: str, *sources: tuple[type, str]) -> type:
    """A `base` subclass (a Dagster Config or ConfigurableResource) named `name` in `module`, whose
    fields are the overridable knobs of each (settings class, name prefix) in `sources`."""
    definitions: dict[str, tuple[Any, Any]] = {}
    for settings_class, prefix in sources:
        definitions.update(override_fields(settings_class, prefix=prefix))
    return create_model(name, __base__=base, __doc__=doc, __module__=module, **definitions)


def override_names(settings_class: type) -> tuple[str, ...]:
    """The library field names of the overridable knobs of `settings_class`, in declaration order."""
    return tuple(overridable_knobs(settings_class))
