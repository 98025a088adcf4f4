// Compare two cloud assemblies stack by stack with the CDK toolkit's own diff engine
// (@aws-cdk/cloudformation-diff, what `cdk diff` runs) and print the result as JSON.
//
//   node tools/review/diff.mjs <base cdk.out> <head cdk.out>
//
// The engine decides each resource's change impact (update, replace, destroy, orphan) from its
// CloudFormation spec and reads the IAM statement and security-group rule changes. What it does
// not do, and this script adds, is follow a replacement across stacks: a consumer reads a
// producer's output (Fn::GetStackOutput or Fn::ImportValue) whose value a replacement changes,
// which the consumer's own template cannot show.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import cfnDiff from '@aws-cdk/cloudformation-diff';

const { fullDiff } = cfnDiff;
const REPLACED = ' (replaced)';

function readAssembly(dir) {
  const manifest = JSON.parse(readFileSync(join(dir, 'manifest.json'), 'utf8'));
  const stacks = new Map();
  for (const [id, artifact] of Object.entries(manifest.artifacts ?? {})) {
    if (artifact.type !== 'aws:cloudformation:stack') continue;
    const template = JSON.parse(readFileSync(join(dir, artifact.properties.templateFile), 'utf8'));
    // Version reporting changes with the construct library's versions, not with the platform.
    delete template.Resources?.CDKMetadata;
    stacks.set(id, { stackName: artifact.properties.stackName ?? id, template });
  }
  return stacks;
}

function walk(node, visit) {
  if (Array.isArray(node)) {
    node.forEach((item) => walk(item, visit));
  } else if (node !== null && typeof node === 'object') {
    if (visit(node) === false) return;
    Object.values(node).forEach((value) => walk(value, visit));
  }
}

// Logical IDs a value reads through Ref, Fn::GetAtt or Fn::Sub.
function references(value) {
  const ids = new Set();
  walk(value, (node) => {
    const keys = Object.keys(node);
    if (keys.length !== 1) return true;
    const [fn] = keys;
    const arg = node[fn];
    if (fn === 'Ref' && typeof arg === 'string') ids.add(arg);
    if (fn === 'Fn::GetAtt') ids.add(Array.isArray(arg) ? arg[0] : String(arg).split('.')[0]);
    if (fn === 'Fn::Sub') {
      const text = Array.isArray(arg) ? arg[0] : arg;
      for (const match of String(text).matchAll(/\$\{([^!}][^}.]*)/g)) ids.add(match[1]);
    }
    return true;
  });
  return ids;
}

// Point a consumer's reads of changed outputs at a different value, so that the engine judges the
// consumer's properties as it would the deployed change. `changed` maps `<stack>/<output>` and
// `export:<name>` to the producer's replaced resources.
function markChangedReads(template, changed) {
  const copy = structuredClone(template);
  const via = new Map();
  walk(copy.Resources ?? {}, (node) => {
    const stackOutput = node['Fn::GetStackOutput'];
    if (stackOutput && typeof stackOutput.StackName === 'string') {
      const key = `${stackOutput.StackName}/${stackOutput.OutputName}`;
      if (changed.has(key)) {
        stackOutput.OutputName += REPLACED;
        via.set(stackOutput.OutputName, changed.get(key));
      }
      return false;
    }
    const imported = node['Fn::ImportValue'];
    if (typeof imported === 'string' && changed.has(`export:${imported}`)) {
      node['Fn::ImportValue'] = imported + REPLACED;
      via.set(node['Fn::ImportValue'], changed.get(`export:${imported}`));
      return false;
    }
    return true;
  });
  return { template: copy, via };
}

// Outputs of `stack` whose value a replacement (WILL_REPLACE, as the engine itself propagates) changes.
function changedOutputs(stack, diff, into) {
  const replaced = new Set();
  diff.resources.forEachDifference((logicalId, change) => {
    if (change.changeImpact === 'WILL_REPLACE') replaced.add(logicalId);
  });
  for (const [name, output] of Object.entries(stack.template.Outputs ?? {})) {
    const hits = [...references(output.Value)].filter((id) => replaced.has(id));
    if (hits.length === 0) continue;
    const source = { stack: stack.stackName, output: name, replaced: hits.sort() };
    into.set(`${stack.stackName}/${name}`, source);
    if (typeof output.Export?.Name === 'string') into.set(`export:${output.Export.Name}`, source);
  }
}

function cdkPath(resource) {
  return resource?.Metadata?.['aws:cdk:path'] ?? null;
}

// A value that was only marked as read from a replaced output reads as its source, not as the marker.
function viaOf(value, via) {
  const sources = new Set();
  walk(value ?? null, (node) => {
    for (const key of [node['Fn::ImportValue'], node['Fn::GetStackOutput']?.OutputName]) {
      if (typeof key === 'string' && via.has(key)) sources.add(via.get(key));
    }
    return true;
  });
  return [...sources];
}

function resourceChange(logicalId, change, oldTemplate, newTemplate, via) {
  // The engine compares normalised copies (and the marked template); report the templates' own values.
  const oldProperties = oldTemplate.Resources?.[logicalId]?.Properties ?? {};
  const newProperties = newTemplate.Resources?.[logicalId]?.Properties ?? {};
  const properties = Object.entries(change.propertyUpdates).map(([name, diff]) => ({
    name,
    impact: diff.changeImpact ?? null,
    old: oldProperties[name] ?? null,
    new: newProperties[name] ?? null,
    via: viaOf(diff.newValue, via),
  }));
  return {
    logicalId,
    path: cdkPath(change.newValue) ?? cdkPath(change.oldValue),
    change: change.isAddition ? 'added' : change.isRemoval ? 'removed' : 'updated',
    impact: change.changeImpact,
    oldType: change.oldResourceType ?? null,
    newType: change.newResourceType ?? null,
    // What happens to the deployed resource depends on the policy it was deployed with.
    deletionPolicy: change.oldValue?.DeletionPolicy ?? null,
    properties,
    other: Object.keys(change.otherChanges),
  };
}

function renderStatement(statement) {
  const targets = (t) => ({ not: t.not, values: [...t.values] });
  return {
    effect: statement.effect,
    actions: targets(statement.actions),
    resources: targets(statement.resources),
    principals: targets(statement.principals),
    condition: statement.condition ?? null,
  };
}

// Which changed resources hold a statement (the engine reports statements for the whole template).
function statementSources(diff, oldTemplate, newTemplate) {
  const sources = [];
  diff.resources.forEachDifference((logicalId, change) => {
    const single = (template) => {
      const resource = template.Resources?.[logicalId];
      return resource ? { Resources: { [logicalId]: resource } } : {};
    };
    const own = fullDiff(single(oldTemplate), single(newTemplate)).iamChanges.statements;
    const type = change.newResourceType ?? change.oldResourceType;
    for (const statement of [...own.additions, ...own.removals]) sources.push({ statement, logicalId, type });
  });
  return (statement) =>
    sources.filter((s) => s.statement.equal(statement)).map(({ logicalId, type }) => ({ logicalId, type }));
}

function securityGroupRules(rules) {
  return rules.map((rule) => ({
    ...rule.toJson(),
    protocol: rule.describeProtocol(),
    peerText: rule.describePeer(),
  }));
}

// The engine's diff of one stack, with reads of `changed` outputs marked (see markChangedReads).
function impactDiff(base, head, changed) {
  const { template: marked, via } = markChangedReads(head?.template ?? {}, changed);
  return { diff: fullDiff(base?.template ?? {}, marked), via };
}

function stackJson(base, head, { diff, via }) {
  const oldTemplate = base?.template ?? {};
  const newTemplate = head?.template ?? {};
  const resources = [];
  diff.resources.forEachDifference((logicalId, change) => {
    resources.push(resourceChange(logicalId, change, oldTemplate, newTemplate, via));
  });
  // Permissions and rules as the templates write them: a marked read is not a new statement.
  const plain = fullDiff(oldTemplate, newTemplate);
  const sourcesOf = statementSources(plain, oldTemplate, newTemplate);
  const statements = (list) => list.map((s) => ({ ...renderStatement(s), sources: sourcesOf(s) }));
  const outputs = [];
  diff.outputs.forEachDifference((name, change) => {
    outputs.push({ name, change: change.isAddition ? 'added' : change.isRemoval ? 'removed' : 'updated' });
  });
  const sections = ['awsTemplateFormatVersion', 'description', 'transform']
    .filter((name) => diff[name]?.isDifferent)
    .concat(['conditions', 'mappings', 'metadata', 'parameters', 'unknown'].filter((n) => diff[n].differenceCount > 0));
  const { iamChanges: iam, securityGroupChanges: sg } = plain;
  return {
    stack: (head ?? base).stackName,
    status: !base ? 'added' : !head ? 'removed' : 'changed',
    resources,
    outputs,
    sections,
    iam: {
      added: statements(iam.statements.additions),
      removed: statements(iam.statements.removals),
      managedPoliciesAdded: iam.managedPolicies.additions.map((m) => ({ ...m })),
      managedPoliciesRemoved: iam.managedPolicies.removals.map((m) => ({ ...m })),
    },
    securityGroups: {
      ingressAdded: securityGroupRules(sg.ingress.additions),
      ingressRemoved: securityGroupRules(sg.ingress.removals),
      egressAdded: securityGroupRules(sg.egress.additions),
      egressRemoved: securityGroupRules(sg.egress.removals),
    },
  };
}

function main([baseDir, headDir]) {
  if (!baseDir || !headDir) {
    process.stderr.write('usage: node tools/review/diff.mjs <base cdk.out> <head cdk.out>\n');
    process.exit(2);
  }
  const base = readAssembly(baseDir);
  const head = readAssembly(headDir);
  const ids = [...head.keys(), ...[...base.keys()].filter((id) => !head.has(id))];

  // A replacement changes the outputs other stacks read: diff again until no further output changes.
  let changed = new Map();
  let diffs;
  for (let round = 0; round <= ids.length; round += 1) {
    diffs = new Map(ids.map((id) => [id, impactDiff(base.get(id), head.get(id), changed)]));
    const next = new Map();
    for (const [id, { diff }] of diffs) {
      if (head.has(id)) changedOutputs(head.get(id), diff, next);
    }
    if (next.size === changed.size) break;
    changed = next;
  }
  const stacks = ids
    .filter((id) => !diffs.get(id).diff.isEmpty)
    .map((id) => stackJson(base.get(id), head.get(id), diffs.get(id)));
  process.stdout.write(`${JSON.stringify({ stacks }, null, 1)}\n`);
}

main(process.argv.slice(2));
