"""The LwM2M object model, loaded from OMA object definition XML (the LwM2M registry's
format: ``<LWM2M><Object><ObjectID>``, ``<Resources><Item ID=...><Type>``).

``protocols/lwm2m/xml/`` ships the core objects 0-7; ``ObjectModel.load_dir`` adds more
(IPSO objects, vendor objects) from a configured directory. The model gives resource
types to the content decoders (TLV carries no types) and names to the docs and tools.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

SHIPPED = Path(__file__).parent / "xml"


@dataclass(frozen=True, slots=True)
class Resource:
    id: int
    name: str
    type: str  # String, Integer, Float, Boolean, Opaque, Time, Objlnk, "" (executable)
    operations: str  # R, W, RW, E, ""
    multiple: bool
    mandatory: bool


@dataclass(slots=True)
class ObjectDef:
    id: int
    name: str
    multiple: bool
    mandatory: bool
    resources: dict[int, Resource] = field(default_factory=dict)


class ObjectModel:
    def __init__(self) -> None:
        self.objects: dict[int, ObjectDef] = {}

    @classmethod
    def shipped(cls) -> ObjectModel:
        model = cls()
        model.load_dir(SHIPPED)
        return model

    def load_dir(self, directory: str | Path) -> None:
        for f in sorted(Path(directory).glob("*.xml")):
            self.load(f.read_bytes())

    def load(self, xml: bytes) -> None:
        root = ET.fromstring(xml)
        for obj in root.iter("Object"):
            oid = int(_text(obj, "ObjectID"))
            d = ObjectDef(
                oid, _text(obj, "Name"), _text(obj, "MultipleInstances") == "Multiple",
                _text(obj, "Mandatory") == "Mandatory",
            )
            res = obj.find("Resources")
            for item in res.iter("Item") if res is not None else ():
                rid = int(item.get("ID", "-1"))
                d.resources[rid] = Resource(
                    rid, _text(item, "Name"), _text(item, "Type"), _text(item, "Operations"),
                    _text(item, "MultipleInstances") == "Multiple",
                    _text(item, "Mandatory") == "Mandatory",
                )
            self.objects[oid] = d

    def resource(self, path: str) -> Resource | None:
        parts = [p for p in path.split("/") if p]
        if len(parts) < 3:
            return None
        try:
            obj = self.objects.get(int(parts[0]))
            return obj.resources.get(int(parts[2])) if obj else None
        except ValueError:
            return None

    def type_of(self, path: str) -> str | None:
        r = self.resource(path)
        return r.type if r is not None and r.type else None


def _text(el: ET.Element, tag: str) -> str:
    found = el.find(tag)
    return (found.text or "").strip() if found is not None else ""
