"""Re-time a study's top variants and a recording's best side by side, in one process.

    python tools/retime_against_recording.py [--top 5] [--recorded 3] [--recording FILE]

For the default GIoU problem on an H100 (the study `tuner search --gpu H100` makes): the
study's top variants and the recording's fastest, timed interleaved (`LiveEvaluator.retime`),
fastest first, each marked with its state in the study.
"""

import argparse
import json


def main() -> None:
    from tuner.store import study as studies
    from tuner.store import trials
    from tuner.search.evaluate import LiveEvaluator
    from tuner.families import giou

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--recorded", type=int, default=3)
    ap.add_argument("--recording", default="tests/data/h100-giou-bf16-u8.jsonl")
    args = ap.parse_args()
    problem = giou.Problem()
    st = studies.load(studies.study_name("giou", "H100", problem.key(), "fwd+bwd"))
    space = giou.space_for(problem.__dict__)
    frame = trials.trials_frame(st, space)
    top = list(trials.top(frame, args.top)["variant"])
    recs = [json.loads(line) for line in open(args.recording)]
    ok = sorted((r for r in recs if r["status"] == "ok" and r["problem"] == problem.key()),
                key=lambda r: r["fwd"]["median_us"] + r["bwd"]["median_us"])
    recorded = [r["variant"] for r in ok[:args.recorded]]
    names = list(dict.fromkeys(top + recorded))
    state = {n: (frame.loc[frame["variant"] == n, "state"].iloc[0] if (frame["variant"] == n).any() else "-")
             for n in names}
    by_name = {v.name: v for v in space}
    variants = [by_name[n] for n in names]
    ev = LiveEvaluator("H100", problem, "fwd+bwd")
    try:
        t = ev.retime(variants, ev.prepare(variants), "fwd+bwd")
    finally:
        ev.close()
    print(f"study winner: {st.user_attrs.get('winner', {}).get('variant')}; recording's best: {recorded}")
    for us, n in sorted((t[n]["fwd"]["median_us"] + t[n]["bwd"]["median_us"], n) for n in names):
        tags = ", ".join(x for x, on in ((f"study top {args.top}", n in top),
                                        (f"recording #{recorded.index(n) + 1}" if n in recorded else "", n in recorded))
                         if on)
        print(f"{us:8.2f} us  {n}  (study state {state[n]}; {tags})")


if __name__ == "__main__":
    main()
