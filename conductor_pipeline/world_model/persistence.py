"""A fitted world model on disk without pickles: LightGBM's own model files plus JSON.

Loading a pickle runs whatever code its author put in it, and the world model lives on the
artifacts volume every step (and, on a cluster, every pod) can write. So a saved W is a folder:

    <name>/success.lgb, cost.lgb, latency.lgb   LightGBM text models (`Booster.save_model`)
    <name>/state.json                           settings, seats, category vocabulary, feature
                                                columns, the text representation's fitted state
                                                (arrays as base64 of their little-endian bytes,
                                                so floats come back bit for bit), training summary
    <name>/manifest.json                        written last: format version, feature list, and
                                                every file's size and sha256

`load_world_model` refuses a folder whose manifest is missing, of another format version, or does
not match its files (naming the file), and refuses a pickle from an earlier version with a message
saying how to rebuild it; it never unpickles anything. The folder is built beside its target and
renamed into place, so a reader sees the old model or the new one.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from conductor_pipeline.files import (
    atomic_path,
    decode_array,
    encode_array,
    manifest_problem,
    read_manifest,
    write_failure,
    write_manifest,
)
from conductor_pipeline.pools.config import WorkerSeat
from conductor_pipeline.world_model.features import (
    CategoryVocabulary,
    MiniLmText,
    TextFeaturizer,
    TfidfSvdText,
    WorldModelSettings,
)
from conductor_pipeline.world_model.model import RegressorInfo, WorldModel

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
STATE = "state.json"
BOOSTERS = ("success", "cost", "latency")
# Pickles start with the PROTO opcode (protocol 2 and later).
_PICKLE_MAGIC = b"\x80"
REBUILD_HINT = (
    "materialize world_model first to rebuild it "
    "(`make run`, or `dagster asset materialize -m assets.definitions --select world_model`)"
)


class WorldModelFileError(ValueError):
    """A saved world model that is refused: absent, damaged, of another format, or a pickle."""


# --- arrays and the text representations ---------------------------------------------------------


def _text_state(text_model: TextFeaturizer | None) -> dict[str, Any] | None:
    if text_model is None:
        return None
    if isinstance(text_model, TfidfSvdText):
        vectorizer = text_model.vectorizer
        params = vectorizer.get_params()
        return {
            "kind": TfidfSvdText.name,
            "n_components": text_model.n_components,
            "seed": text_model.seed,
            "vectorizer": {
                "sublinear_tf": params["sublinear_tf"], "ngram_range": list(params["ngram_range"]),
                "min_df": params["min_df"], "max_features": params["max_features"],
                "dtype": np.dtype(params["dtype"]).name,
            },
            # Terms in index order, so the vocabulary is a plain list.
            "terms": sorted(vectorizer.vocabulary_, key=vectorizer.vocabulary_.__getitem__),
            "idf": encode_array(vectorizer.idf_),
            "svd_components": encode_array(text_model.svd.components_),
        }
    if isinstance(text_model, MiniLmText):
        pca = text_model.pca
        return {
            "kind": MiniLmText.name, "n_components": text_model.n_components, "batch_size": text_model.batch_size,
            "seed": text_model.seed, "pca_components": encode_array(pca.components_), "pca_mean": encode_array(pca.mean_),
            "pca_explained_variance": encode_array(pca.explained_variance_),
        }
    raise TypeError(f"no file format for text representation {type(text_model).__name__}")


def _text_model(state: dict[str, Any] | None) -> TextFeaturizer | None:
    """Rebuild the fitted text representation: scikit-learn's own objects with the fitted state
    set, so transforms run the same code on the same numbers as before saving."""
    from sklearn.decomposition import PCA, TruncatedSVD  # noqa: PLC0415 (heavy: imported where W is loaded)
    from sklearn.feature_extraction.text import TfidfVectorizer  # noqa: PLC0415

    if state is None:
        return None
    if state["kind"] == TfidfSvdText.name:
        text = TfidfSvdText(state["n_components"], seed=state["seed"])
        params = state["vectorizer"]
        terms = state["terms"]
        text.vectorizer = TfidfVectorizer(
            sublinear_tf=params["sublinear_tf"], ngram_range=tuple(params["ngram_range"]), min_df=params["min_df"],
            max_features=params["max_features"], dtype=np.dtype(params["dtype"]).type,
            vocabulary={term: index for index, term in enumerate(terms)},
        )
        text.vectorizer.idf_ = decode_array(state["idf"])
        components = decode_array(state["svd_components"])
        text.svd = TruncatedSVD(n_components=components.shape[0], random_state=state["seed"])
        text.svd.components_ = components
        text.svd.n_features_in_ = components.shape[1]
        text._idf = text.vectorizer.idf_.astype(np.float64)
        text._projection = components.T.astype(np.float64)
        return text
    if state["kind"] == MiniLmText.name:
        text = MiniLmText(state["n_components"], batch_size=state["batch_size"], seed=state["seed"])
        components = decode_array(state["pca_components"])
        pca = PCA(n_components=components.shape[0], random_state=state["seed"])
        pca.components_, pca.mean_ = components, decode_array(state["pca_mean"])
        pca.explained_variance_ = decode_array(state["pca_explained_variance"])
        pca.n_components_, pca.n_features_in_ = components.shape
        text.pca = pca
        return text
    raise WorldModelFileError(f"unknown text representation {state['kind']!r}")


# --- save and load ---------------------------------------------------------------------------------


def save_world_model(model: WorldModel, folder: str | Path) -> Path:
    """Write `model` as the folder described above, built beside `folder` and renamed into place."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = folder.with_name(f".{folder.name}.staging")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        staging.mkdir()
        boosters = {name: getattr(model, f"{name}_booster") for name in BOOSTERS}
        for name, booster in boosters.items():
            if booster is not None:
                booster.save_model(str(staging / f"{name}.lgb"))
        state = {
            "settings": model.settings.model_dump(mode="json"),
            "seats": {name: seat.model_dump(mode="json") for name, seat in model.seats.items()},
            "vocabulary": {key: list(value) for key, value in asdict(model.vocabulary).items()},
            "text_model": _text_state(model.text_model),
            "feature_names": model.feature_names,
            "kept_columns": model.kept_columns,
            "boosters": {name: f"{name}.lgb" if booster is not None else None for name, booster in boosters.items()},
            "cost_info": asdict(model.cost_info),
            "latency_info": asdict(model.latency_info),
            "training_summary": model.training_summary,
            "training_question_ids": sorted(model.training_question_ids),
        }
        with atomic_path(staging / STATE, "world-model state") as path:
            path.write_text(json.dumps(state))
        kept = [model.feature_names[i] for i in model.kept_columns]
        write_manifest(staging, MANIFEST, {"world_model_format": FORMAT_VERSION, "features": kept})
        previous = folder.with_name(f".{folder.name}.previous")
        shutil.rmtree(previous, ignore_errors=True)
        if folder.exists():
            folder.replace(previous)
        staging.replace(folder)
        shutil.rmtree(previous, ignore_errors=True)
    except Exception as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise write_failure(folder, "world model", exc) from exc
    return folder


def refuse_pickle(path: Path) -> None:
    """Raise for a pickled world model (an earlier version's format): it is never loaded."""
    raise WorldModelFileError(
        f"{path} is a pickled world model from an earlier version of this project; pickles are never loaded "
        f"(loading one runs any code it carries): delete it, then {REBUILD_HINT}"
    )


def load_world_model(folder: str | Path) -> WorldModel:
    """The world model saved in `folder`, after its manifest is checked (format version, feature
    list, every file's sha256); `WorldModelFileError` naming the file otherwise. A pickle is refused."""
    folder = Path(folder)
    if folder.is_file():
        with folder.open("rb") as handle:
            if handle.read(1) == _PICKLE_MAGIC or folder.suffix == ".pkl":
                refuse_pickle(folder)
        raise WorldModelFileError(f"{folder} is a file, not a saved world model folder; {REBUILD_HINT}")
    if not folder.is_dir():
        legacy = folder.with_name(f"{folder.name}.pkl")
        if legacy.is_file():  # what an earlier version saved here
            refuse_pickle(legacy)
        raise WorldModelFileError(f"no world model at {folder}; {REBUILD_HINT}")
    manifest = read_manifest(folder, MANIFEST)
    if manifest is None:
        raise WorldModelFileError(f"{folder / MANIFEST} is missing or unreadable: the model was never completed; {REBUILD_HINT}")
    if manifest.get("world_model_format") != FORMAT_VERSION:
        raise WorldModelFileError(
            f"{folder / MANIFEST}: world-model format {manifest.get('world_model_format')!r}, this code reads "
            f"{FORMAT_VERSION}; {REBUILD_HINT}"
        )
    problem = manifest_problem(folder, MANIFEST)
    if problem is not None:
        raise WorldModelFileError(f"world model {folder} does not match its manifest: {problem}; {REBUILD_HINT}")
    state = json.loads((folder / STATE).read_text())
    kept = [state["feature_names"][i] for i in state["kept_columns"]]
    import lightgbm as lgb  # noqa: PLC0415 (heavy: imported where W is loaded)

    boosters = {
        name: lgb.Booster(model_file=str(folder / file)) if file else None for name, file in state["boosters"].items()
    }
    for name, booster in boosters.items():
        if manifest["features"] != kept or (booster is not None and booster.feature_name() != kept):
            raise WorldModelFileError(
                f"{folder / f'{name}.lgb'}: its features differ from the manifest's feature list; {REBUILD_HINT}"
            )
    return WorldModel(
        settings=WorldModelSettings(**state["settings"]),
        seats={name: WorkerSeat.model_validate(seat) for name, seat in state["seats"].items()},
        vocabulary=CategoryVocabulary(**{key: tuple(value) for key, value in state["vocabulary"].items()}),
        text_model=_text_model(state["text_model"]),
        feature_names=list(state["feature_names"]),
        kept_columns=list(state["kept_columns"]),
        success_booster=boosters["success"],
        cost_booster=boosters["cost"],
        latency_booster=boosters["latency"],
        cost_info=RegressorInfo(**state["cost_info"]),
        latency_info=RegressorInfo(**state["latency_info"]),
        training_summary=state["training_summary"],
        training_question_ids=frozenset(state["training_question_ids"]),
    )
