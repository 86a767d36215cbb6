"""Export one GIoU variant (bfloat16/uint8, the covering set's) for the attached GPU, for
`tuner bench --family giou --artifact DIR` to time the op's call cost (GPU machine).

    python tools/giou_call_cost.py DIR
"""

import argparse


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", help="the export's folder")
    args = ap.parse_args()

    from tuner import gpus
    from tuner.deploy import export
    from tuner.families import giou

    variant = next(v for v in giou.covering_set()
                   if v.as_dict()["pred"] == "bfloat16" and v.as_dict()["target"] == "uint8")
    print(export.write(args.dir, [{"variant": variant, "problem": giou.Problem().__dict__}], gpus.attached().describe()))


if __name__ == "__main__":
    main()
