"""Rewrites every scenario table in SIMULATIONS.md from simulations/results/<name>/report.json.

    python3 scripts/simulation-tables.py write          # after re-running the scenarios
    python3 scripts/simulation-tables.py check          # print what would change
    python3 scripts/simulation-tables.py check DIR P    # the same from DIR/P<name>.json files
"""
import json,re,sys,os
def fmt_int(n):
    s=f"{int(n):,}".replace(',',' ')
    return s
def row(mode, m, pure_calls, extra):
    hyb = mode=='hybrid'
    calls=fmt_int(m['store_calls'])
    if mode in ('hybrid', 'hybrid-rate'):
        pct = 100.0*m['store_calls']/pure_calls if pure_calls else 0
        calls=f"**{calls}** ({pct:.1f} %)" if hyb else f"{calls} ({pct:.1f} %)"
    over=str(m['max_window_overshoot'])
    cells=[f"**{mode}**" if hyb else mode, f"{m['utilization']:.4f}", f"{m['first_second_admission']:.3f}",
           f"{m['jain_acceptance']:.4f}", f"{m['min_max_acceptance_ratio']:.3f}", f"**{over}**" if hyb else over,
           calls, str(int(m['store_calls_per_s_per_node_max'])), f"{m['redis_cpu']:.4f}", fmt_int(m['tokens_stranded'])]
    if extra:
        cells.append(f"{m['recovery_s']:.1f}")
    return '| '+' | '.join(cells)+' |'
def load(name, src, prefix):
    p = os.path.join(src, f"{prefix}{name}.json") if src else f"simulations/results/{name}/report.json"
    return json.load(open(p))
def rewrite(text, src=None, prefix=''):
    lines=text.split('\n'); out=[]; name=None; i=0
    while i<len(lines):
        l=lines[i]
        m=re.match(r'^### ([a-z0-9-]+) — ',l)
        if m: name=m.group(1)
        if l.startswith('| mode | util |') and name:
            extra = 'recovery' in l
            out.append(l); out.append(lines[i+1]); i+=2
            d=load(name, src, prefix)
            pure=d['modes'].get('pure-redis',{}).get('store_calls',0)
            while i<len(lines) and lines[i].startswith('| '):
                mode=lines[i].split('|')[1].strip().strip('*')
                out.append(row(mode, d['modes'][mode], pure, extra)); i+=1
            name=None
            continue
        out.append(l); i+=1
    return '\n'.join(out)
if __name__=='__main__':
    text=open('SIMULATIONS.md').read()
    if len(sys.argv)>2:
        new=rewrite(text, sys.argv[2], sys.argv[3])
    else:
        new=rewrite(text)
    if sys.argv[1]=='check':
        import difflib
        print('\n'.join(difflib.unified_diff(text.split('\n'),new.split('\n'),lineterm='',n=0)))
    else:
        open('SIMULATIONS.md','w').write(new)
