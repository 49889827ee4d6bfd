"""Warm-up probe (training goals only): after the warm-up, does the policy take the expert's action on the
expert's own product pages?

    python benchmarks/warmup_probe.py [--episodes 24] [--epochs 2] [--lr 1e-3] [--item_epochs K] [--save F.safetensors]
        [--load F.safetensors] [--out PREFIX] [any flag of examples/train_webshop.py]

Builds the main job's trainer (its WebShop defaults plus the flags given), with the WebShop splits re-cut as in
``warmup_design.py`` (the last 30 training goals are the probe's goals, never the eval split), collects the warm-up's
demonstrations on the first ``--episodes`` training goals, trains them with the warm-up's ``SFTTrainer`` (1 row per
step), then greedy-decodes (64 new tokens) every product-page row of the expert's episodes on the 30 probe goals and
prints how many of the expert's option clicks and buys the policy repeats (``select rows a/b, buy rows c/d``); the
completions go to ``PREFIX_<phase>.json``. ``--item_epochs K`` then trains K more epochs on the product-page
demonstrations only and probes again. A much cheaper reading than a whole evaluation (one SFT, ~76 prompts, no
rollouts); the figures are in benchmarks/experiments/warmup.md."""
import os, sys, time, json, re
os.environ.setdefault("HF_HUB_OFFLINE", "1")

def main():
    import argparse

    # the probe's own flags; every other flag goes to the main job's parser (examples/train_webshop.py --help)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("--episodes", type=int, default=24)
    p.add_argument("--epochs", type=float, default=2.0)
    p.add_argument("--item_epochs", type=float, default=0.0)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--out", default="outputs/warmup_probe/probe")
    p.add_argument("--save", default="")
    p.add_argument("--load", default="")
    opts, argv = p.parse_known_args()
    import torch
    episodes, epochs, item_epochs, lr = opts.episodes, opts.epochs, opts.item_epochs, opts.lr
    out, save, load = opts.out, opts.save, opts.load
    held = 30
    from gigpo_trl import job as J
    from gigpo_trl.warmup import collect_demonstrations, build_sft_trainer
    from warmup_design import recut_splits
    recut_splits(held)
    parser = J.build_parser({"env": "webshop"}, {**J.EXAMPLE_DEFAULTS["webshop"], "output_dir": out})
    job, args, model_args = parser.parse_args_and_config(argv + ["--overwrite_output_dir", "true"])
    base, _, tok = J.load_base_model(model_args)
    args.model_init_kwargs = {**(args.model_init_kwargs or {}), "dtype": model_args.dtype or "auto"}
    factory, _, train_ds, eval_ds = J.load_tasks(job)
    trainer, _ = J.build_trainer(job, args, model_args, base, tok, factory, train_ds, eval_ds)
    t0 = time.time()
    demos, st = collect_demonstrations(trainer, episodes, progress=False)
    probe, _ = collect_demonstrations(trainer, held, tasks=eval_ds, progress=False)
    def is_item(row):
        user = row["prompt"][-1]["content"]
        return "Buy Now" in user and "Page:" in user and "Buy Now" in user.split("Page:")[-1]
    def tag(ds):
        return [is_item(ds[i]) for i in range(len(ds))]
    item_probe = [i for i, f in enumerate(tag(probe)) if f]
    print(f"[probe] demos {st['rows']} rows; probe rows {len(probe)}, item rows {len(item_probe)}; "
          f"{time.time() - t0:.0f}s", flush=True)
    model = trainer.model
    def greedy(label):
        t = time.time()
        model.eval()
        hits = {"select": [0, 0], "buy": [0, 0]}
        outs = []
        for s in range(0, len(item_probe), 8):
            idx = item_probe[s:s + 8]
            seqs = []
            for i in idx:
                r = probe[i]; n = len(r["input_ids"]) - sum(r["completion_mask"])
                seqs.append(r["input_ids"][:n])
            L = max(map(len, seqs))
            ids = torch.tensor([[tok.pad_token_id] * (L - len(x)) + x for x in seqs])
            att = torch.tensor([[0] * (L - len(x)) + [1] * len(x) for x in seqs])
            with torch.no_grad():
                g = model.generate(input_ids=ids, attention_mask=att, max_new_tokens=64, do_sample=False,
                                   pad_token_id=tok.pad_token_id)
            for i, row in zip(idx, g[:, L:]):
                text = tok.decode(row, skip_special_tokens=True)
                want = probe[i]["completion"][0]["content"]
                wa = re.search(r"<action>(.*?)</action>", want).group(1)
                m = re.search(r"<action>(.*?)</action>", text)
                ga = m.group(1).strip().lower() if m else None
                k = "buy" if wa == "click[buy now]" else "select"
                hits[k][1] += 1; hits[k][0] += ga == wa
                outs.append({"want": want, "got": text})
        model.train()
        print(f"[probe] {label}: select rows {hits['select'][0]}/{hits['select'][1]}, "
              f"buy rows {hits['buy'][0]}/{hits['buy'][1]} ({time.time() - t:.0f}s)", flush=True)
        json.dump(outs, open(f"{out}_{label}.json", "w"), indent=1)
    if load:
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file
        set_peft_model_state_dict(model, load_file(load))
        print(f"[probe] loaded {load}", flush=True)
    else:
        t = time.time()
        res = build_sft_trainer(trainer, demos, st, epochs=epochs, learning_rate=lr, batch_size=1,
                                seed=args.seed).train()
        print(f"[probe] sft {res.global_step} steps loss {res.training_loss:.4f} {time.time()-t:.0f}s", flush=True)
        if save:
            from peft import get_peft_model_state_dict
            from safetensors.torch import save_file
            save_file({k: v.contiguous() for k, v in get_peft_model_state_dict(model).items()}, save)
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    greedy("after_sft")
    if item_epochs:
        items = demos.select([i for i, f in enumerate(tag(demos)) if f])
        t = time.time()
        res = build_sft_trainer(trainer, items, st, epochs=item_epochs, learning_rate=lr, batch_size=1,
                                seed=args.seed).train()
        print(f"[probe] item-only sft on {len(items)} rows: {res.global_step} steps loss "
              f"{res.training_loss:.4f} {time.time() - t:.0f}s", flush=True)
        greedy("after_item")


if __name__ == "__main__":
    main()
