"""The slashing game, played adversarially against the real contracts on one anvil
(docs/game.md): a seeded adversary takes N random actions from the whole action table (every
external function with adversarial arguments, cheating operators, sybil verifiers, colluding
votes, governance changes, time jumps) while the honest parties run their real software
(VerifierNode.step, the Challenger, ChainBatchSink), and the invariants are checked after
every step.

    bench/game.py --steps N --seed S [--seeds K] [--episode-steps E] [--no-governance]
    bench/game.py --replay violation.json     # a violation printed by an earlier run

Prints each violation (seed, episode, step, trace) and one JSON object as the last line:
{"steps", "actions" (count per action kind), "violations", "seed", "steps_per_s", ...}.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from verinfer.testing.game.play import play, replay
from verinfer.testing.game.world import World


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200, help="actions per seed")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--seeds", type=int, default=1, help="play seeds seed .. seed+K-1")
    ap.add_argument("--episode-steps", type=int, default=40,
                    help="actions per episode (anvil is reverted to the setup between)")
    ap.add_argument("--no-governance", action="store_true",
                    help="governance does not change parameters or allowlists")
    ap.add_argument("--sybils", type=int, default=3)
    ap.add_argument("--honest-verifiers", type=int, default=3)
    ap.add_argument("--replay", type=Path, help="a violation JSON (its trace) to replay")
    ap.add_argument("--violations-out", type=Path, help="write every violation here (JSON)")
    args = ap.parse_args()
    world = World(honest_verifiers=args.honest_verifiers, sybils=args.sybils)
    try:
        if args.replay:
            v = json.loads(args.replay.read_text())
            res = replay(world, v["trace"], seed=v.get("seed", 0), episode=v.get("episode", 0),
                         governance=not args.no_governance)
            for x in res.violations:
                print(x, file=sys.stderr)
            print(json.dumps({"replayed_steps": len(res.trace),
                              "violations": len(res.violations),
                              "kinds": sorted({x.kind for x in res.violations})}))
            return
        summaries = []
        for seed in range(args.seed, args.seed + args.seeds):
            summaries.append(play(world, seed=seed, steps=args.steps,
                                  episode_steps=args.episode_steps,
                                  governance=not args.no_governance))
    finally:
        world.close()
    violations = [v for s in summaries for v in s["violation_list"]]
    for v in violations:
        print(f"VIOLATION {v['kind']} seed={v['seed']} episode={v['episode']} "
              f"step={v['step']}: {v['detail']}\n  trace: {json.dumps(v['trace'])}",
              file=sys.stderr)
    if args.violations_out:
        args.violations_out.write_text(json.dumps(violations, indent=1))
    actions: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    payoffs: Counter[str] = Counter()
    for s in summaries:
        actions.update(s["actions"])
        outcomes.update(s["outcomes"])
        payoffs.update(s["payoffs_wei"])
    steps = sum(s["steps"] for s in summaries)
    wall = sum(s["wall_s"] for s in summaries)
    print(json.dumps({
        "steps": steps, "actions": dict(sorted(actions.items())),
        "violations": len(violations), "seed": args.seed, "seeds": args.seeds,
        "violation_kinds": dict(Counter(v["kind"] for v in violations)),
        "episodes": sum(s["episodes"] for s in summaries),
        "reverted_actions": sum(s["reverted_actions"] for s in summaries),
        "honest_minority_penalties": sum(s["honest_minority_penalties"] for s in summaries),
        "outcomes": dict(sorted(outcomes.items())),
        "payoffs_eth": {k: round(v / 1e18, 4) for k, v in sorted(payoffs.items())},
        "wall_s": round(wall, 2), "steps_per_s": round(steps / wall, 2) if wall else 0.0,
        "rpc_requests": sum(s["rpc_calls_batched"] for s in summaries),
    }))


if __name__ == "__main__":
    main()
