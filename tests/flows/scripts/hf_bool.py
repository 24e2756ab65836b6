"""An HfArgumentParser dataclass with a bool field that defaults to True: each
rank reports what it parsed."""

from dataclasses import dataclass

from transformers import HfArgumentParser

from _common import rank, write_json


@dataclass
class Options:
    tag: str
    use_feature: bool = True


(options,) = HfArgumentParser(Options).parse_args_into_dataclasses()
write_json("hf-%s-%d.json" % (options.tag, rank()), {"use_feature": options.use_feature})
