"""A fresh local MLflow store for a test without MLflow's schema migrations each time: a new SQLite
store runs MLflow's ~50 Alembic migrations (about a second of CPU), the same work for every store.
MLflow makes one empty store per test process (its real schema, by its own code) and each test
that needs a fresh store gets a byte copy of it at the path its run will use. What a test then
writes and reads goes through MLflow as before; the `slow` tests' `rlexp train` runs still have
MLflow create their stores."""
from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path


@functools.cache
def _empty_store() -> Path:
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    folder = Path(tempfile.mkdtemp(prefix="rlexp-test-mlflow-"))
    atexit.register(shutil.rmtree, folder, True)
    db = folder / "mlflow.db"
    store = SqlAlchemyStore(f"sqlite:///{db.as_posix()}", (folder / "artifacts").as_uri())
    store.engine.dispose()  # closed: the file is complete before it is copied
    return db


def fresh_store(db: Path) -> Path:
    """An empty MLflow store at `db` (a SQLite file that must not exist yet); returns `db`."""
    assert not db.exists(), f"{db} exists: a fresh store goes where none is"
    db.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_empty_store(), db)
    return db
